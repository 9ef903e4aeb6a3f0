"""Bounds on how long a held turn waits for a rule that is only worth a bounded wait.

Pure module: functions that change a `Draft`, no I/O. Two rules hold a turn that could run
elsewhere at once, because running it elsewhere costs more than a short wait:

- soft affinity: an idle run resident on its replica waits for that replica, where its prefix
  is cached. Once it has waited SOFT_WAIT_FACTOR times what reading its context again would
  cost the engine (learned per replica, `learned.PrefillFit`, times the sequences such a read
  stalls there: a prompt read on a batching engine holds up every sequence decoding beside it;
  SOFT_WAIT_DEFAULT_S until known, never less than SOFT_WAIT_MIN_S), the wait has cost more
  than the move would, and it gives up its residency and goes to any replica with room, as a
  new run: but only once another replica has room for it now with none of its own runs' turns
  waiting for it. In a pool where every replica is full a move starts the turn no sooner; it
  only takes a place in another queue and reads the context again there. Counting the read
  alone let runs move out of a saturated pool's queues at a fraction of that cost (measured: a
  fifth of batch throughput on engines capped at 8 running), and moving between full replicas
  cost a sixth of the turns of a pool of two 4-slot engines with plain-message agents (bench
  lab, llamacpp-26-20);
- the KV rule: a new run waits while the replicas' resident runs leave no room for it in their
  KV pools. After NEW_RUN_MAX_HOLD_S it goes to any replica with room (overdue), so a pool
  whose runs never end cannot starve new ones.

Checked on every tick (1 s), so a bound is met within a second.
"""

from __future__ import annotations

import math

from luftpause.scheduler.core import queues, residency
from luftpause.scheduler.core.model import NEW_RUN_MAX_HOLD_S, Bucket, HeldTurn, Phase, Run, evolve
from luftpause.scheduler.core.state import Draft, View

SOFT_WAIT_FACTOR = 2.0
SOFT_WAIT_MIN_S = 1.0
SOFT_WAIT_DEFAULT_S = 10.0


def soft_wait_s(view: View, run: Run) -> float:
    """How long an idle resident run's turn waits for its replica before it may move."""
    replica = view.replicas.get(run.replica)
    reread = residency.reread_s(run, replica) if replica is not None else None
    if replica is None or reread is None:
        return SOFT_WAIT_DEFAULT_S
    stalled = max(replica.engine_running or 0, replica.in_flight, 1)
    return max(SOFT_WAIT_FACTOR * reread * stalled, SOFT_WAIT_MIN_S)


def release_waits(d: Draft, at: float) -> list[Bucket]:
    """Release the held turns whose bounded wait ran out; return the buckets they went to.

    It looks at the held turns only when one may be due: an idle resident run (`idle_resident`:
    a turn of it may wait for its replica) or a turn queued in an "m" bucket since
    NEW_RUN_MAX_HOLD_S ago (`new_held_since`). A saturated pool whose held turns wait for runs
    paused on tools, or as new runs, has neither most of the time, and a tick costs nothing
    however many turns are held (walking 100,000 of them took a tenth of a second)."""
    if not d.idle_resident and at - d.new_held_since < NEW_RUN_MAX_HOLD_S:
        return []
    moved: list[Bucket] = []
    idle = Phase.IDLE
    runs = d.runs  # read again after every release, which may change runs
    oldest = d.new_held_since = math.inf  # lowered again by the turns queued meanwhile
    for held in d.held.values():  # the held turns as the tick found them (the map is immutable)
        kind = held.bucket[0]
        if kind == "r":
            # A run pinned to its replica, or no longer resident there, has no bounded wait:
            # most held turns of a saturated pool, passed over without a call.
            run = runs.get(held.run_id)
            if run is None or not run.footprint or (run.replica and run.phase is not idle):
                continue
            moved += _soft_wait(d, held, run, at)
            runs = d.runs
        elif kind == "m":
            if at - held.arrived_at >= NEW_RUN_MAX_HOLD_S:
                d.held = d.held.set(held.id, evolve(held, overdue=True))
                moved += queues.rebucket_run(d, held.run_id)
                runs = d.runs
            elif held.arrived_at < oldest:
                oldest = held.arrived_at
    d.new_held_since = min(d.new_held_since, oldest)
    return moved


def _soft_wait(d: Draft, held: HeldTurn, run: Run, at: float) -> list[Bucket]:
    """`held`'s idle resident `run` gives up its residency if it waited long enough and
    another replica has room for it."""
    if at - held.arrived_at < soft_wait_s(d, run) or not room_elsewhere(d, held, run.replica):
        return []
    residency.leave(d, run)  # its replica gains room for new runs: see `Draft.opened`
    return queues.rebucket_run(d, run.id)


def room_elsewhere(view: View, held: HeldTurn, home: str) -> bool:
    """Whether a replica other than `home` has room for `held` now (its room set: healthy,
    serving the model, a free place for the class), with no turn of a run of its own waiting
    for it."""
    cls = held.service_class
    heads = view.heads
    return any(
        rid != home and not heads.get((("r", rid, held.model), cls))
        for rid in view.room_ids(view.room_for(("o", held.model, cls)))
    )
