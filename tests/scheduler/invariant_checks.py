"""Checks the core's state machine test applies after each step (see test_core_invariants)."""

from __future__ import annotations

from collections import Counter

from luftpause.scheduler.core import counters, expiry, placement, queues, residency, shares
from luftpause.scheduler.core.events import (
    Admit,
    Event,
    Place,
    Resync,
    RunEnded,
    Tick,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
)
from luftpause.scheduler.core.model import (
    NEW_RUN_MAX_HOLD_S,
    HeldTurn,
    Run,
    ServiceClass,
    Turn,
)
from luftpause.scheduler.core.state import Draft, State


def stays_home(state: State, run: Run) -> bool:
    """Pinned (generating, paused on a tool) or resident: its turns wait for its replica."""
    return bool(run.replica) and (
        (state.rules.affinity and run.pinned) or (state.rules.soft_affinity and run.footprint > 0)
    )


def kv_allows(pool: int | None, resident: int, new_run: int, cls: ServiceClass) -> bool:
    """The KV rule: a new run starts while it and the resident runs fit in 87.5 % of the pool
    (batch in 75 %), or when nothing is resident."""
    if pool is None or resident <= 0:
        return True
    share = 0.875 if cls is ServiceClass.INTERACTIVE else 0.75
    return resident + new_run <= share * pool


def may_unpin(before: State, event: Event, run_id: str) -> bool:
    """Whether `event` itself may legitimately leave the run idle, free it or forget it."""
    if isinstance(event, Tick | Resync):
        return True
    if isinstance(event, RunEnded):
        return event.run_id == run_id
    if isinstance(event, TurnFinished | TurnFailed | TurnAbandoned):
        turn = before.turns.get(event.turn_id)
        return turn is not None and turn.run_id == run_id
    return False


def could_take(state: State, held: HeldTurn, replica_id: str) -> bool:
    """Whether `held` may go to `replica_id` at all (ignoring room)."""
    replica = state.replicas[replica_id]
    if not replica.healthy or held.model not in replica.models:
        return False
    run = state.runs.get(held.run_id)
    if run is not None and stays_home(state, run):
        if run.replica == replica_id:
            return True
        home = state.replicas.get(run.replica)
        if home is not None and home.healthy and held.model in home.models:
            return False
    if held.overdue or replica.new_fits(held.service_class):
        return True
    return bool(state.room_for(("m", held.model, held.service_class)))


def after_turns(state: State, run_id: str) -> list[Turn]:
    return [t for t in state.turns.values() if t.run_id == run_id]


def check_residency(state: State) -> None:
    """Resident tokens and new-run flags equal their rebuild from the runs."""
    totals: Counter[str] = Counter()
    for run in state.runs.values():
        if run.footprint:
            assert run.replica in state.replicas, f"{run.id} resident on no replica"
            totals[run.replica] += run.footprint
    new_run = residency.new_run_tokens(state)
    rebuilt = Draft(state)
    residency.rebuild(rebuilt)
    for rid, replica in state.replicas.items():
        assert replica.resident_tokens == totals[rid], f"{rid}: resident tokens drifted"
        flags = (replica.new_batch_fits, replica.new_interactive_fits)
        expected = tuple(
            kv_allows(replica.kv_tokens, totals[rid], new_run, cls) or not state.rules.kv_rule
            for cls in (ServiceClass.BATCH, ServiceClass.INTERACTIVE)
        )
        assert flags == expected, f"{rid}: stale new-run fits"
        assert rebuilt.replicas[rid] == replica, f"{rid}: differs from its rebuild"


def check_kv_rule(before: State, after: State, event: Event, places: list[Place]) -> None:
    """A new run (one resident nowhere, not held past NEW_RUN_MAX_HOLD_S) started past a
    replica's KV pool only while some replica had room for a new run, or while that replica had
    nothing waiting to be read and read its pool again faster than runs come back (`spills`;
    else it is held; where it goes among those with room is the
    cost's choice, which counts the overflow). The resident tokens just before each placement
    are those after the step less the footprints added by the placements there later in the
    step (runs held past the longest hold add theirs unchecked), and its reading pending then
    is the reading pending after the step less that of the placements there from it on; a
    replica a run moved away from during the step is not checked (its total also fell).
    Nothing to check with the rule off."""
    if not after.rules.kv_rule:
        return
    moved_from: set[str] = set()
    added: dict[str, list[tuple[ServiceClass, int, bool]]] = {}
    seen: set[str] = set()
    for action in places:
        turn = after.turns[action.turn_id]
        run = before.runs.get(turn.run_id)
        if turn.run_id in seen or turn.single_pass:
            continue
        seen.add(turn.run_id)
        if isinstance(event, Admit) and event.placed_on and event.run_id == turn.run_id:
            continue  # resident where its dataplane just placed a turn of it (unchecked)
        if run is not None and run.resident and run.replica != action.replica_id:
            moved_from.add(run.replica)
        if run is not None and (run.pinned or run.resident) and run.replica == action.replica_id:
            continue  # resident there already: never held by the rule, adds nothing
        held = before.held.get(turn.id)
        overdue = held is not None and (
            held.overdue
            or (isinstance(event, Tick) and event.at - held.arrived_at >= NEW_RUN_MAX_HOLD_S)
        )
        footprint = after.runs[turn.run_id].footprint if turn.run_id in after.runs else 0
        room = ("m", turn.model, turn.service_class)
        anywhere = bool(before.room_for(room) or after.room_for(room))
        checked = not overdue and not anywhere
        added.setdefault(action.replica_id, []).append((turn.service_class, footprint, checked))
    new_run = residency.new_run_tokens(after)
    reading: dict[str, list[int]] = {}
    for action in places:
        turn = after.turns[action.turn_id]
        reading.setdefault(turn.replica, []).append(turn.prefill_tokens)
    for rid, placed in added.items():
        replica = after.replicas[rid]
        if replica.kv_tokens is None or rid in moved_from:
            continue
        # Reading pending just before the step's first placement there.
        pending = replica.pending_prefill - sum(reading.get(rid, []))
        idle_first = pending <= 0 and (rid not in before.replicas or before.replicas[rid].spills)
        total = replica.resident_tokens
        for i, (cls, footprint, checked) in enumerate(reversed(placed)):
            total -= footprint
            if checked and not (idle_first and i == len(placed) - 1):
                ok = kv_allows(replica.kv_tokens, total, new_run, cls)
                assert ok, f"a new {cls} run started on {rid} past its KV pool, none had room"


def check_rebuilds(state: State, at: float) -> None:
    """Each index, as kept step by step, equals its owner's rebuild from the facts alone.

    Lazy indexes are compared by what they mean: the turn-timeout order and the queues may hold
    entries of turns since gone (skipped when read), the run and residency checks may hold
    stale or early entries (rescheduled when due); what must hold is that every live entry is
    there, in the order the rebuild gives.
    """
    rebuilt = Draft(state)
    counters.rebuild(rebuilt)
    assert rebuilt.replicas == state.replicas, "replica counters differ from their rebuild"
    assert rebuilt.runs == state.runs, "runs' turns in flight differ from their rebuild"
    assert rebuilt.caller_in_flight == state.caller_in_flight, "caller counts differ"

    rebuilt = Draft(state)
    placement.rebuild(rebuilt)
    kept = {k: v for k, v in state.room.items() if v}
    assert kept == dict(rebuilt.room.items()), "room sets differ from their rebuild"

    rebuilt = Draft(state)
    residency.rebuild(rebuilt)
    assert rebuilt.replicas == state.replicas, "resident tokens differ from their rebuild"
    assert rebuilt.idle_resident == state.idle_resident, "idle resident runs miscounted"
    checked = set().union(*(_chain_ids(c) for c in state.residency_checks.values()))
    for run in state.runs.values():
        if run.footprint and run.resident_until > 0 and not run.turns_in_flight:
            assert run.id in checked, f"{run.id}: its residency is never checked"

    rebuilt = Draft(state)
    expiry.rebuild(rebuilt, at)
    live = [
        tid
        for order, tid in sorted(state.turn_order.items())
        if tid in state.turns and state.turns[tid].order == order
    ]
    assert live == [tid for _, tid in sorted(rebuilt.turn_order.items())], "turn order differs"
    for run in state.runs.values():
        if run.turns_in_flight:
            continue  # its turns time out; its idle time starts when they end
        assert run.check_at != -1, f"{run.id}: no idle-expiry check"
        assert run.id in _chain_ids(state.run_checks.get(run.check_at)), f"{run.id}: check lost"

    rebuilt = Draft(state)
    queues.rebuild(rebuilt)
    assert rebuilt.held == state.held, "held turns' buckets differ from their rebuild"
    assert rebuilt.heads == state.heads, "queue heads differ from their rebuild"
    assert _live_queues(state) == _live_queues(rebuilt), "queue order differs from its rebuild"
    assert {r: set(ids) for r, ids in state.held_by_run.items()} == {
        r: set(ids) for r, ids in rebuilt.held_by_run.items()
    }, "held turns by run differ from their rebuild"
    # A bound: no turn held in an "m" bucket arrived before it (the rebuild gives the least).
    assert state.new_held_since <= rebuilt.new_held_since, "a turn held before new_held_since"

    rebuilt = Draft(state)
    shares.rebuild(rebuilt)
    assert rebuilt.shares == state.shares, "class counts per model differ from their rebuild"


def _chain_ids(chain: object) -> set[str]:
    ids: set[str] = set()
    while chain is not None:
        assert isinstance(chain, tuple)
        ids.add(chain[-2] if len(chain) == 3 else chain[0])
        chain = chain[-1]
    return ids


def _live_queues(view: State | Draft) -> dict[object, list[str]]:
    """Per queue, the ids of its turns still held in its bucket, front to back."""
    out: dict[object, list[str]] = {}
    for key, (front, back) in view.queues.items():
        ids: list[str] = []
        for chain, reverse in ((front, False), (back, True)):
            part: list[str] = []
            while chain is not None:
                _, tid, chain = chain
                held = view.held.get(tid)
                if held is not None and held.bucket == key[0]:
                    part.append(tid)
            ids += reversed(part) if reverse else part
        if ids:
            # A turn that left the bucket and came back has a stale entry that is live again.
            out[key] = list(dict.fromkeys(ids))
    return out
