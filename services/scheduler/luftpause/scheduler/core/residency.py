"""Runs resident on a replica, and the KV rule that keeps a replica's working set in its pool.

Pure module: functions from State to State, no I/O. Theory of operation:

- A run is *resident* on its replica while its context is expected to be used there again:
  while a turn of it is in flight, while it is paused on a tool, and after a turn that ended
  without tool calls for as long as runs of its class that end that way are seen to come back
  (`learned.Comeback.window`; 0 for runs that rarely come back). Its *footprint* is the KV its
  context needs there: its context less the part its first turn found cached (a preamble it
  shares with other runs, held once for all of them), plus what the next round is expected to
  add (learned). Before its first turn is reported, a new run's footprint is estimated from the
  size of its request.
- `Replica.resident_tokens` is the sum of the footprints of the runs resident there. An idle
  resident run's next turn waits for its replica like a pinned one's (soft affinity): its
  prefix is there. If it waits longer than reading its context elsewhere would take, it gives
  up its residency and may move (`decide._tick`).
- The KV rule: on a replica whose KV pool is known, a new run (or one that is resident nowhere)
  starts only while the resident footprints and the learned footprint of a new run fit in a
  share of the pool: KV_MARGIN_BATCH for a batch run, KV_MARGIN_INTERACTIVE for an interactive
  one (the rest is headroom for the engine's own cache churn). A replica with nothing resident
  always takes one, so no run is too big to ever start. Turns of resident
  runs are never held by this rule: they fit by construction, and holding them would only add
  their wait to a full engine. Without it, runs whose contexts add up to more than the pool
  evict each other's prefixes while they wait on tools, and every turn re-reads its context.

Every function keeps `resident_tokens` and the replica's `new_*_fits` flags in step with the
runs; `rebuild` recomputes them from the runs alone (resync, and the property tests).
"""

from __future__ import annotations

import math

import immutables

from luftpause.scheduler.core.model import (
    KV_MARGIN_BATCH,
    KV_MARGIN_INTERACTIVE,
    RESIDENCY_STEP_S,
    Replica,
    Run,
    State,
    evolve,
    put,
)
from luftpause.scheduler.core.placement import set_replica


def footprint(state: State, run: Run) -> int:
    """The KV `run`'s context needs on its replica, with its next round (at least 1)."""
    own = max(run.context_tokens - run.shared_tokens, 0)
    return max(own + state.sizes.next_round, 1)


def first_footprint(state: State, prompt_bytes: int) -> int:
    """A new run's footprint before any usage is reported: its request, sized by bytes."""
    return max(state.sizes.prompt_estimate(prompt_bytes) + state.sizes.next_round, 1)


def new_run_tokens(state: State) -> int:
    """What a new run is expected to need (0 until one has been seen)."""
    return round(state.sizes.new_run_tokens)


def fits(replica: Replica, resident: int, new_run: int) -> tuple[bool, bool]:
    """Whether a new batch and a new interactive run may start on `replica` (the KV rule)."""
    pool = replica.kv_tokens
    if pool is None or resident <= 0:
        return True, True
    need = resident + new_run
    return need <= KV_MARGIN_BATCH * pool, need <= KV_MARGIN_INTERACTIVE * pool


def _with_resident(state: State, replica: Replica, resident: int) -> State:
    batch, interactive = fits(replica, resident, new_run_tokens(state))
    if (resident, batch, interactive) == (
        replica.resident_tokens,
        replica.new_batch_fits,
        replica.new_interactive_fits,
    ):
        return state
    updated = evolve(
        replica,
        resident_tokens=resident,
        new_batch_fits=batch,
        new_interactive_fits=interactive,
    )
    return set_replica(state, updated)


def refresh(state: State, replica_id: str) -> State:
    """Recompute a replica's new-run flags (its pool or the new-run size changed)."""
    replica = state.replicas.get(replica_id)
    if replica is None:
        return state
    return _with_resident(state, replica, replica.resident_tokens)


def refresh_all(state: State) -> State:
    for replica_id in state.replicas:
        state = refresh(state, replica_id)
    return state


def set_footprint(state: State, run: Run, tokens: int, until: float = 0.0) -> tuple[State, Run]:
    """Make `run` count `tokens` (0: not resident) on its replica until `until` (0: while a
    turn of it is in flight); store it."""
    tokens = tokens if run.replica else 0
    replica = state.replicas.get(run.replica) if run.replica else None
    if replica is not None and tokens != run.footprint:
        state = _with_resident(state, replica, replica.resident_tokens - run.footprint + tokens)
    updated = evolve(run, footprint=tokens if replica is not None else 0, resident_until=until)
    state = put(state, runs=state.runs.set(run.id, updated))
    if updated.footprint and until > 0:
        state = _schedule(state, run.id, until)
    return state, updated


def _schedule(state: State, run_id: str, until: float) -> State:
    step = math.ceil(until / RESIDENCY_STEP_S)
    cursor = state.residency_cursor
    return put(
        state,
        residency_checks=state.residency_checks.set(
            step, (run_id, state.residency_checks.get(step))
        ),
        residency_cursor=step if cursor == -1 or step < cursor else cursor,
    )


def expire(state: State, at: float) -> tuple[State, list[str]]:
    """End the residency of every idle or paused run not back by `at` (one whose turn is held
    is back: `holds` bounds its wait). Returns the replicas whose working set shrank. Costs
    nothing while no residency is due, so every event may call it."""
    cursor = state.residency_cursor
    if cursor == -1 or cursor * RESIDENCY_STEP_S > at:
        return state, []
    checks = state.residency_checks
    last = math.floor(at / RESIDENCY_STEP_S + 1e-9)
    freed: list[str] = []
    for step in range(cursor, last + 1):
        chain = checks.get(step)
        if chain is None:
            continue
        checks = checks.delete(step)
        while chain is not None:
            rid, chain = chain
            run = state.runs.get(rid)
            if run is None or not run.resident or run.turns_in_flight or run.resident_until > at:
                continue  # gone, left already, generating, or expected later (rescheduled)
            if rid in state.held_by_run:
                state = _schedule(put(state, residency_checks=checks), rid, at + 1.0)
                checks = state.residency_checks
                continue
            home = run.replica
            state, _ = leave(put(state, residency_checks=checks), run)
            checks = state.residency_checks
            freed.append(home)
    if not checks:
        nxt = -1
    else:
        nxt = last + 1 if state.residency_cursor <= last else state.residency_cursor
    return put(state, residency_checks=checks, residency_cursor=nxt), freed


def leave(state: State, run: Run) -> tuple[State, Run]:
    """`run` is no longer resident anywhere (it moves, ends, or was given up)."""
    if not run.footprint:
        return state, run
    return set_footprint(state, run, 0)


def rebuild(state: State) -> State:
    """Every replica's resident tokens and new-run flags, and the residency index, recomputed
    from the runs."""
    totals: dict[str, int] = {}
    state = put(state, residency_checks=immutables.Map(), residency_cursor=-1)
    for run in state.runs.values():
        if run.footprint and run.replica:
            totals[run.replica] = totals.get(run.replica, 0) + run.footprint
            if run.resident_until > 0:
                state = _schedule(state, run.id, run.resident_until)
    for replica in state.replicas.values():
        state = _with_resident(state, replica, totals.get(replica.id, 0))
    return state


def reread_s(state: State, run: Run, replica: Replica) -> float | None:
    """Seconds `replica` would take to read `run`'s context again; None while unknown."""
    slope = replica.prefill.s_per_token
    if slope is None or not run.context_tokens:
        return None
    return slope * max(run.context_tokens - run.shared_tokens, 0)
