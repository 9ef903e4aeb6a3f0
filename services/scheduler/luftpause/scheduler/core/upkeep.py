"""Upkeep of the decision core: what probes report and what the clock ends.

Pure module: functions that change a `Draft`, no I/O; time is an argument. `decide` calls
`probe` for a `ProbeResult` and `tick` for a `Tick`.
"""

from __future__ import annotations

from luftpause.scheduler.core import expiry, holds, lifecycle, residency
from luftpause.scheduler.core.events import (
    Action,
    DataplaneReleased,
    ProbeResult,
    RunExpired,
    TurnExpired,
)
from luftpause.scheduler.core.model import Bucket, evolve, kv_full, limit_of, next_cap
from luftpause.scheduler.core.placement import mark_read, set_replica
from luftpause.scheduler.core.state import Draft


def probe(d: Draft, ev: ProbeResult) -> None:
    """A probe's result: the replica's health, engine load and KV pool; its cap follows."""
    replica = d.replicas.get(ev.replica_id)
    if replica is None:
        return
    if ev.running is not None and replica.unread:
        # It reports its engine's load: an engine of our own, not a hosted API.
        mark_read(d, replica.id)
        replica = d.replicas[ev.replica_id]
    pool = replica.kv_config or ev.kv_total or replica.kv_tokens
    most = ev.max_running or replica.max_running
    seen = replica
    if (pool, most) != (replica.kv_tokens, replica.max_running):
        seen = evolve(replica, kv_tokens=pool, max_running=most)
    # A queue with the KV full shows the engine bound by its KV (see the status page).
    kv_bound = kv_full(seen, ev.kv_used) if (ev.waiting or 0) > 0 else replica.kv_bound
    cap = next_cap(seen, ev.running, ev.waiting)
    facts = (ev.healthy, ev.running, ev.waiting, cap, pool, ev.kv_used, kv_bound, most)
    if facts == (
        replica.healthy,
        replica.engine_running,
        replica.engine_waiting,
        replica.cap,
        replica.kv_tokens,
        replica.kv_used,
        replica.kv_bound,
        replica.max_running,
    ):
        return
    updated = evolve(
        seen,
        healthy=ev.healthy,
        engine_running=ev.running,
        engine_waiting=ev.waiting,
        cap=cap,
        capacity=limit_of(cap, replica.slots, replica.unread),
        kv_used=ev.kv_used,
        kv_bound=kv_bound,
    )
    set_replica(d, updated)
    if pool != replica.kv_tokens:
        residency.refresh(d, replica.id)
    if ev.healthy != replica.healthy:
        d.opened.append(replica.id)  # its pinned runs may move, or come back to it


def tick(d: Draft, at: float) -> tuple[list[Action], list[Bucket]]:
    """The clock: turns never reported back, runs idle too long, bounded waits run out, and
    dataplanes gone past their grace period."""
    actions: list[Action] = []
    moved: list[Bucket] = []
    for tid in expiry.timed_out_turns(d, at):
        turn = d.turns[tid]
        moved += lifecycle.end_turn(d, turn, at, tool_calls=False)
        actions.append(TurnExpired(turn_id=tid, replica_id=turn.replica))
    for rid in expiry.due_run_checks(d, at):
        run = evolve(d.runs[rid], check_at=-1)
        d.runs = d.runs.set(rid, run)
        if expiry.idle_expired(run, at):
            moved += lifecycle.forget_run(d, rid)
            actions.append(RunExpired(run_id=rid))
        else:
            expiry.schedule_run_check(d, run, expiry.check_due(run, at))
    moved += holds.release_waits(d, at)
    for dataplane, link in list(d.dataplanes.items()):
        if link.gone_since is not None and at - link.gone_since >= d.dataplane_grace_s:
            released, more = _release_dataplane(d, dataplane, at)
            moved += more
            actions.append(DataplaneReleased(dataplane=dataplane, turns=released))
    return actions, moved


def _release_dataplane(d: Draft, dataplane: str, at: float) -> tuple[int, list[Bucket]]:
    """Free every turn a gone dataplane had in flight; it no longer reports them."""
    gone = [t for t in d.turns.values() if t.dataplane == dataplane]
    moved: list[Bucket] = []
    for turn in gone:
        moved += lifecycle.end_turn(d, turn, at, tool_calls=False)
    d.dataplanes = d.dataplanes.delete(dataplane)
    return len(gone), moved
