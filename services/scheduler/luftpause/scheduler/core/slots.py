"""Engine slots: which slot of a replica's engine a placed turn takes (endpoint `slots`).

Pure module. llama.cpp keeps one conversation's KV cache per slot. For a replica configured
with `slots`, the core keeps what each slot holds (the run whose turn it last served) and which
slots have a turn in flight, and picks the slot for each turn it places:

1. the idle slot that holds the turn's own run: its context is there;
2. otherwise an idle slot whose content no one will come back for: empty, or held by a run the
   core has forgotten, that moved to another replica, or that is generating elsewhere;
3. then the slot of a run that finished its last turn without a tool call (it is likely done);
4. then the slot of a batch run paused on a tool, then of an interactive one;
each group the least recently active first, then the lowest slot. None when every slot is busy
(the turn then goes without a slot and the engine picks, as before).
"""

from __future__ import annotations

from collections.abc import Mapping

from luftpause.scheduler.core.model import Phase, Replica, Run, ServiceClass


def _loss(replica: Replica, slot: int, runs: Mapping[str, Run]) -> tuple[int, float]:
    """What overwriting `slot` costs: (group, last active) — lower is cheaper."""
    holder = runs.get(replica.slot_runs[slot]) if replica.slot_runs[slot] else None
    if holder is None or holder.replica != replica.id or holder.phase is Phase.GENERATING:
        return 0, 0.0
    if holder.phase is Phase.IDLE:
        return 1, holder.last_active
    return (2 if holder.service_class is ServiceClass.BATCH else 3), holder.last_active


def pick(replica: Replica, run_id: str, runs: Mapping[str, Run]) -> int | None:
    """The slot a turn of `run_id` takes on `replica`, or None if all are busy."""
    free = [s for s in range(replica.slots) if s not in replica.busy_slots]
    if not free:
        return None
    for s in free:
        if run_id and replica.slot_runs[s] == run_id:
            return s
    return min(free, key=lambda s: (*_loss(replica, s, runs), s))


def take(replica: Replica, slot: int, run_id: str) -> dict[str, object]:
    """The replica's slot fields once a turn of `run_id` is in `slot`."""
    holders = list(replica.slot_runs)
    holders[slot] = run_id
    return {"slot_runs": tuple(holders), "busy_slots": replica.busy_slots | {slot}}
