"""Bounds on how long a held turn waits for a rule that is only worth a bounded wait.

Pure module: functions from State to State, no I/O. Two rules hold a turn that could run
elsewhere at once, because running it elsewhere costs more than a short wait:

- soft affinity: an idle run resident on its replica waits for that replica, where its prefix
  is cached. Once it has waited SOFT_WAIT_FACTOR times what reading its context on another
  replica would take (learned per replica, `learned.PrefillFit`; SOFT_WAIT_DEFAULT_S until
  known, never less than SOFT_WAIT_MIN_S), the wait has cost more than the move would: it gives
  up its residency and goes to any replica with room, as a new run;
- the KV rule: a new run waits while the replicas' resident runs leave no room for it in their
  KV pools. After NEW_RUN_MAX_HOLD_S it goes to any replica with room (overdue), so a pool
  whose runs never end cannot starve new ones.

Checked on every tick (1 s), so a bound is met within a second.
"""

from __future__ import annotations

from luftpause.scheduler.core import queues, residency
from luftpause.scheduler.core.model import (
    NEW_RUN_MAX_HOLD_S,
    Bucket,
    HeldTurn,
    Run,
    State,
    evolve,
    put,
)

SOFT_WAIT_FACTOR = 2.0
SOFT_WAIT_MIN_S = 1.0
SOFT_WAIT_DEFAULT_S = 10.0


def soft_wait_s(state: State, run: Run) -> float:
    """How long an idle resident run's turn waits for its replica before it may move."""
    replica = state.replicas.get(run.replica)
    reread = residency.reread_s(state, run, replica) if replica is not None else None
    if reread is None:
        return SOFT_WAIT_DEFAULT_S
    return max(SOFT_WAIT_FACTOR * reread, SOFT_WAIT_MIN_S)


def release_waits(state: State, at: float) -> tuple[State, list[Bucket]]:
    """Release the held turns whose bounded wait ran out; return the buckets they went to."""
    moved: list[Bucket] = []
    for held in list(state.held.values()):
        kind = held.bucket[0]
        if kind == "r":
            state, more = _soft_wait(state, held, at)
        elif kind == "m" and at - held.arrived_at >= NEW_RUN_MAX_HOLD_S:
            state, more = _overdue(state, held)
        else:
            continue
        moved += more
    return state, moved


def _soft_wait(state: State, held: HeldTurn, at: float) -> tuple[State, list[Bucket]]:
    run = state.runs.get(held.run_id)
    if run is None or run.pinned or not run.resident:
        return state, []
    if at - held.arrived_at < soft_wait_s(state, run):
        return state, []
    home = run.replica
    state, _ = residency.leave(state, run)
    state, moved = queues.rebucket_run(state, run.id)
    return state, [*moved, *queues.buckets_for_replica(state, home)]


def _overdue(state: State, held: HeldTurn) -> tuple[State, list[Bucket]]:
    state = put(state, held=state.held.set(held.id, evolve(held, overdue=True)))
    return queues.rebucket_run(state, held.run_id)
