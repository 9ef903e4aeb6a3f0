"""Engine slots: which slot of a replica's engine a placed turn takes (endpoint `slots`).

Pure module. llama.cpp keeps one conversation's KV cache per slot. For a replica configured
with `slots`, the core keeps what each slot holds (the run whose turn it last served) and which
slots have a turn in flight, and picks the slot for each turn it places: the idle slot that
holds the turn's own run if there is one (its context is there), else the idle slot whose
content will be wanted again last, as a cache evicts the entry used furthest in the future:

0. empty, or held by a run the core has forgotten, that moved to another replica, or that is
   generating elsewhere: no one comes back for it;
1. a run that finished its last turn without a tool call and is not expected back (not
   resident: runs like it rarely came back, or not this soon; see `residency`);
2. a batch run still in its tool call, or idle but expected back (resident): its next turn will
   queue behind the turns held now;
3. a batch run whose next turn is held now;
4. an interactive run still in its tool call, or idle but expected back;
5. an interactive run whose next turn is held now: it goes next.

Within a group, the run that will be wanted last goes first: in a tool call, the one paused
most recently; held, the one whose turn arrived last. Then the lowest slot. None when every
slot is busy (the turn then goes without a slot and the engine picks, as before).

Save files (replica `saves`, endpoint `slot_saves`). A slot taken from a run in groups 2 to 5
(it comes back) is saved first to one of the engine's K files, and a run whose slot was taken
has its context restored from its file into the slot its next turn gets (`offload`). Files are
kept by the same order: a file whose run will not come back is free; else the one wanted last
is overwritten, and only for a context wanted sooner than it. A restored file is free again
(its context is back in a slot), and a save never goes to the file restored by the same turn:
the dataplane saves before it restores.

The files are the only part of the slot tables a scheduler restart would lose for long (a slot
is taken again by the next turn): each placement that saves names the run it saves
(`saved_run`), the dataplane remembers what it saved and not yet restored, and its Resync
refills the files a restarted scheduler knows nothing of (`relearn`).
"""

from __future__ import annotations

import hashlib
import re

from luftpause.scheduler.core.events import SavedSlot
from luftpause.scheduler.core.model import Phase, Replica, ServiceClass, Turn
from luftpause.scheduler.core.state import View

# Groups whose run will come back to its context: worth a save.
_COMES_BACK = 2


def _wanted(state: View, replica: Replica, slot: int) -> tuple[int, float]:
    """When `slot`'s content is wanted again, as (group, order): lower is later, evict first."""
    return _run_wanted(state, replica, replica.slot_runs[slot])


def _run_wanted(state: View, replica: Replica, run_id: str) -> tuple[int, float]:
    """When the context of `run_id` on `replica` is wanted again (see `_wanted`)."""
    holder = state.runs.get(run_id) if run_id else None
    if holder is None or holder.replica != replica.id or holder.phase is Phase.GENERATING:
        return 0, 0.0
    if holder.phase is Phase.IDLE and not holder.resident:
        return 1, 0.0
    interactive = holder.service_class is ServiceClass.INTERACTIVE
    held = state.held_by_run.get(holder.id)
    if not held:
        return (4 if interactive else 2), -holder.last_active
    return (5 if interactive else 3), -min(state.held[t].seq for t in held)


def pick(state: View, replica: Replica, run_id: str) -> int | None:
    """The slot a turn of `run_id` takes on `replica`, or None if all are busy."""
    free = [s for s in range(replica.slots) if s not in replica.busy_slots]
    if not free:
        return None
    for s in free:
        if run_id and replica.slot_runs[s] == run_id:
            return s
    return min(free, key=lambda s: (*_wanted(state, replica, s), s))


def take(replica: Replica, slot: int, run_id: str) -> tuple[str, ...]:
    """The replica's slot table once a turn of `run_id` is in `slot` (the slot is busy then:
    `counters` counts it)."""
    holders = list(replica.slot_runs)
    holders[slot] = run_id
    return tuple(holders)


def offload(state: View, replica: Replica, slot: int, run_id: str) -> tuple[int, int]:
    """For a turn of `run_id` about to take `slot` (not yet taken): the file to save the slot's
    content to first, and the file to restore the run's context from; -1 for none.
    """
    if not replica.saves:
        return -1, -1
    holder = replica.slot_runs[slot]
    if holder == run_id:
        return -1, -1  # its context is there
    restore = replica.saves.index(run_id) if run_id and run_id in replica.saves else -1
    if not holder:
        return -1, restore
    wanted = _run_wanted(state, replica, holder)
    if wanted[0] < _COMES_BACK:
        return -1, restore
    if holder in replica.saves:  # an older copy of the same context: overwrite it
        return replica.saves.index(holder), restore
    files = [f for f in range(len(replica.saves)) if f != restore]
    if not files:
        return -1, restore
    victim = min(files, key=lambda f: (*_run_wanted(state, replica, replica.saves[f]), f))
    if _run_wanted(state, replica, replica.saves[victim]) >= wanted:
        return -1, restore  # every file holds a context wanted sooner than this one
    return victim, restore


def keep(replica: Replica, save: int, restore: int, holder: str) -> dict[str, object]:
    """The replica's `saves` once `holder`'s context is saved to `save` and `restore` is read."""
    files = list(replica.saves)
    if restore >= 0:
        files[restore] = ""
    if save >= 0:
        files[save] = holder
    return {"saves": tuple(files)}


def save_file(replica_id: str, index: int) -> str:
    """The engine-side file name of save file `index` of a replica (llama.cpp takes a bare
    name, no path: letters, digits, `-` and `_` only here; an id with others gets a hash).
    """
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", replica_id)
    if safe != replica_id:
        safe += "-" + hashlib.sha1(replica_id.encode()).hexdigest()[:8]
    return f"luftpause-{safe}-{index}.bin"


def saved_run(state: View, turn: Turn) -> str | None:
    """The run whose context `turn`'s save writes (its file holds it once placed), if any."""
    replica = state.replicas.get(turn.replica)
    if turn.save_to < 0 or replica is None or turn.save_to >= len(replica.saves):
        return None
    return replica.saves[turn.save_to] or None


def relearn(replica: Replica, reported: tuple[SavedSlot, ...]) -> tuple[str, ...]:
    """The replica's `saves` with each file it knows nothing of filled from a dataplane's
    report (the newest save of it there); files it knows stay as they are."""
    files = list(replica.saves)
    newest: dict[int, SavedSlot] = {}
    names = {save_file(replica.id, i): i for i in range(len(files))}
    for s in reported:
        i = names.get(s.file)
        if s.replica != replica.id or i is None or not s.run_id or files[i]:
            continue
        if i not in newest or s.age_s < newest[i].age_s:
            newest[i] = s
    for i, s in newest.items():
        if s.run_id not in files:  # a context is in one file at most
            files[i] = s.run_id
    return tuple(files)
