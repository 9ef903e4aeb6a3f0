"""Engine slots: which slot of a replica's engine a placed turn takes (endpoint `slots`).

Pure module. llama.cpp keeps one conversation's KV cache per slot. For a replica configured
with `slots`, the core keeps what each slot holds (the run whose turn it last served) and which
slots have a turn in flight, and picks the slot for each turn it places: the idle slot that
holds the turn's own run if there is one (its context is there), else the idle slot whose
content will be wanted again last, as a cache evicts the entry used furthest in the future:

0. empty, or held by a run the core has forgotten, that moved to another replica, or that is
   generating elsewhere: no one comes back for it;
1. a run that finished its last turn without a tool call (it is likely done);
2. a batch run still in its tool call: its next turn will queue behind the turns held now;
3. a batch run whose next turn is held now;
4. an interactive run still in its tool call;
5. an interactive run whose next turn is held now: it goes next.

Within a group, the run that will be wanted last goes first: in a tool call, the one paused
most recently; held, the one whose turn arrived last. Then the lowest slot. None when every
slot is busy (the turn then goes without a slot and the engine picks, as before).
"""

from __future__ import annotations

from luftpause.scheduler.core.model import Phase, Replica, ServiceClass, State


def _wanted(state: State, replica: Replica, slot: int) -> tuple[int, float]:
    """When `slot`'s content is wanted again, as (group, order): lower is later, evict first."""
    holder = state.runs.get(replica.slot_runs[slot]) if replica.slot_runs[slot] else None
    if holder is None or holder.replica != replica.id or holder.phase is Phase.GENERATING:
        return 0, 0.0
    if holder.phase is Phase.IDLE:
        return 1, 0.0
    interactive = holder.service_class is ServiceClass.INTERACTIVE
    held = state.held_by_run.get(holder.id)
    if not held:
        return (4 if interactive else 2), -holder.last_active
    return (5 if interactive else 3), -min(state.held[t].seq for t in held)


def pick(state: State, replica: Replica, run_id: str) -> int | None:
    """The slot a turn of `run_id` takes on `replica`, or None if all are busy."""
    free = [s for s in range(replica.slots) if s not in replica.busy_slots]
    if not free:
        return None
    for s in free:
        if run_id and replica.slot_runs[s] == run_id:
            return s
    return min(free, key=lambda s: (*_wanted(state, replica, s), s))


def take(replica: Replica, slot: int, run_id: str) -> dict[str, object]:
    """The replica's slot fields once a turn of `run_id` is in `slot`."""
    holders = list(replica.slot_runs)
    holders[slot] = run_id
    return {"slot_runs": tuple(holders), "busy_slots": replica.busy_slots | {slot}}
