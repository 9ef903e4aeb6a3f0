"""Saved slot contexts (endpoint `slot_saves`): which file a placed turn saves its slot's
content to and which it restores its run's context from. No I/O.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from luftpause.common.config import ConfigError, Priorities, parse_config
from luftpause.scheduler.core import slots
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.events import Action, Place, ProbeResult, Resync, RunEnded, SavedSlot
from luftpause.scheduler.core.model import ServiceClass
from luftpause.scheduler.core.state import State
from luftpause.scheduler.core.status import status_view
from tests.scheduler.helpers import admit, endpoint, finish

BATCH = ServiceClass.BATCH


def saving(slot_count: int = 1, files: int = 2) -> State:
    state = initial_state([replace(endpoint("a"), slots=slot_count, slot_saves=files)])
    state, _ = decide(state, ProbeResult(at=0.0, replica_id="a", healthy=True))
    return state


def moves(actions: tuple[Action, ...], turn: str) -> tuple[int | None, str | None, str | None]:
    """(slot, file saved to, file restored from) of `turn`'s placement, files by index."""
    [place] = [a for a in actions if isinstance(a, Place) and a.turn_id == turn]
    names = {slots.save_file("a", i): str(i) for i in range(8)}
    save = names[place.slot_save] if place.slot_save else None
    restore = names[place.slot_restore] if place.slot_restore else None
    return place.engine_slot, save, restore


def paused(state: State, turn: str, run: str, at: float, **kw: object) -> State:
    """`run`'s turn `turn` placed and ended in a tool call at `at`."""
    state, _ = admit(state, turn, run, at=at, **kw)  # type: ignore[arg-type]
    state, _ = finish(state, turn, tool_calls=True, at=at + 0.5)
    return state


def test_a_paused_run_is_saved_when_its_slot_is_taken_and_restored_on_its_return() -> None:
    state = paused(saving(), "a1", "a", 1.0)
    state, actions = admit(state, "b1", "b", at=2.0)
    assert moves(actions, "b1") == (0, "0", None)
    assert state.replicas["a"].saves == ("a", "")
    state, _ = finish(state, "b1", tool_calls=True, at=2.5)
    state, actions = admit(state, "a2", "a", at=3.0)
    # b is paused too: saved to the other file, before a's is read back.
    assert moves(actions, "a2") == (0, "1", "0")
    assert state.replicas["a"].saves == ("", "b")


def test_a_finished_or_forgotten_runs_context_is_not_saved() -> None:
    state = saving()
    state, _ = admit(state, "a1", "a", at=1.0)
    state, _ = finish(state, "a1", tool_calls=False, at=1.5)  # a is likely done
    state, actions = admit(state, "b1", "b", at=2.0)
    assert moves(actions, "b1") == (0, None, None)
    state, _ = finish(state, "b1", tool_calls=True, at=2.5)
    state, _ = decide(state, RunEnded(at=3.0, run_id="b"))
    state, actions = admit(state, "c1", "c", at=3.5)
    assert moves(actions, "c1") == (0, None, None)
    assert state.replicas["a"].saves == ("", "")


def test_a_run_back_in_its_own_slot_needs_no_file() -> None:
    state = paused(saving(slot_count=2), "a1", "a", 1.0)
    state, actions = admit(state, "b1", "b", at=2.0)  # the empty slot
    assert moves(actions, "b1") == (1, None, None)
    state, actions = admit(state, "a2", "a", at=3.0)
    assert moves(actions, "a2") == (0, None, None)


def test_full_files_keep_the_contexts_wanted_soonest() -> None:
    # One slot, one file. Batch b's context is saved when interactive i takes the slot; i's
    # when interactive j does: i comes back before b, so b's file goes to i. When a new run
    # takes j's slot, i (paused before j) is wanted sooner than j: j is not saved.
    state = paused(saving(files=1), "b1", "b", 1.0, cls=BATCH)
    state = paused(state, "i1", "i", 2.0)
    assert state.replicas["a"].saves == ("b",)
    state = paused(state, "j1", "j", 3.0)
    assert state.replicas["a"].saves == ("i",)
    state, actions = admit(state, "n1", "new", at=4.0)
    assert moves(actions, "n1") == (0, None, None)
    assert state.replicas["a"].saves == ("i",)


def test_a_restored_file_is_free_again_and_the_latest_paused_run_is_saved_first() -> None:
    state = paused(saving(slot_count=2, files=2), "a1", "a", 1.0)
    state = paused(state, "b1", "b", 2.0)
    state, actions = admit(state, "c1", "c", at=3.0)  # a paused first: wanted first, b goes
    assert moves(actions, "c1") == (1, "0", None)
    state, _ = finish(state, "c1", tool_calls=True, at=3.5)
    state, actions = admit(state, "b2", "b", at=4.0)
    # c, paused last, gives up its slot (saved to the free file); b's context comes back.
    assert moves(actions, "b2") == (1, "1", "0")
    assert state.replicas["a"].saves == ("", "c")


def test_status_lists_the_files_and_the_runs_they_hold() -> None:
    state = paused(saving(), "a1", "a", 1.0)
    state, _ = admit(state, "b1", "b", at=2.0)
    [replica] = status_view(state, 3.0)["replicas"]
    assert replica["saves"] == [
        {"file": "luftpause-a-0.bin", "run": "a"},
        {"file": "luftpause-a-1.bin", "run": None},
    ]


def test_file_names_are_bare_and_distinct_per_replica() -> None:
    assert slots.save_file("engine-0", 3) == "luftpause-engine-0-3.bin"
    odd = {slots.save_file(r, 0) for r in ("gpu/0", "gpu:0", "gpu 0", "gpu..0")}
    assert len(odd) == 4
    for name in odd:
        assert name.startswith("luftpause-gpu_") and ".." not in name and "/" not in name


def test_the_config_takes_slot_saves_only_with_slots() -> None:
    raw = {"id": "a", "url": "http://a:1", "models": ["m"], "slots": 2, "slot_saves": 4}
    assert parse_config({"endpoints": [raw]}).endpoints[0].slot_saves == 4
    for bad in (-1, "4", True):
        with pytest.raises(ConfigError, match="slot_saves"):
            parse_config({"endpoints": [{**raw, "slot_saves": bad}]})
    with pytest.raises(ConfigError, match="needs slots"):
        parse_config({"endpoints": [{**raw, "slots": 0}]})


def test_a_turn_never_saves_into_the_file_it_restores_from() -> None:
    # Two slots, one file, an engine that preempts (batch keeps no slot for paused runs).
    # Batch a is saved when i takes its slot; when a comes back, i's slot is the one to take
    # and i is wanted sooner than a, but the only file is a's own: the dataplane saves before
    # it restores, so i is not saved there.
    prio = Priorities(interactive=0, batch=100, preemptive=True)
    state = initial_state([replace(endpoint("a"), slots=2, slot_saves=1, priority=prio)])
    state, _ = decide(state, ProbeResult(at=0.0, replica_id="a", healthy=True))
    state = paused(state, "a1", "a", 1.0, cls=BATCH)
    state = paused(state, "x1", "x", 2.0)
    state = paused(state, "i1", "i", 3.0)
    assert state.replicas["a"].slot_runs == ("i", "x") and state.replicas["a"].saves == ("a",)
    state, actions = admit(state, "a2", "a", cls=BATCH, at=4.0)
    assert moves(actions, "a2") == (0, None, "0")
    assert state.replicas["a"].saves == ("",)


# --- a restarted scheduler learns the files back from the dataplanes' Resync ---


def saved(file: int, run: str, age: float = 1.0, replica: str = "a") -> SavedSlot:
    return SavedSlot(replica=replica, file=slots.save_file("a", file), run_id=run, age_s=age)


def test_a_placement_that_saves_names_the_run_whose_context_it_saves() -> None:
    state = paused(saving(), "a1", "a", 1.0)
    _, actions = admit(state, "b1", "b", at=2.0)
    [place] = [a for a in actions if isinstance(a, Place)]
    assert place.slot_save == slots.save_file("a", 0) and place.slot_save_run == "a"
    state = saving()
    _, actions = admit(state, "c1", "c", at=1.0)  # an empty slot: nothing saved, nobody named
    assert [a.slot_save_run for a in actions if isinstance(a, Place)] == [None]


def test_a_resync_refills_the_files_a_restarted_scheduler_knows_nothing_of() -> None:
    state = saving()  # a scheduler just started: both files unknown
    report = Resync(at=5.0, dataplane="dp", saved=(saved(1, "b"), saved(0, "a")))
    state, _ = decide(state, report)
    assert state.replicas["a"].saves == ("a", "b")
    # The run comes back: its context is restored from its file, which is free again after.
    state, actions = admit(state, "a2", "a", at=6.0)
    assert moves(actions, "a2")[2] == "0" and state.replicas["a"].saves == ("", "b")


def test_a_report_never_overwrites_a_file_the_scheduler_knows_and_the_newest_save_wins() -> None:
    state = paused(saving(), "a1", "a", 1.0)
    state, _ = admit(state, "b1", "b", at=2.0)  # a saved to file 0
    report = (saved(0, "x"), saved(1, "old", age=9.0), saved(1, "new", age=2.0))
    state, _ = decide(state, Resync(at=3.0, dataplane="dp", saved=report))
    assert state.replicas["a"].saves == ("a", "new")


def test_a_report_of_an_unknown_file_or_replica_is_ignored() -> None:
    report = (
        SavedSlot(replica="a", file="other.bin", run_id="x", age_s=0.0),
        saved(0, "y", replica="nope"),
        saved(1, "a"),
        saved(0, "a"),  # a context is in one file at most
    )
    state, _ = decide(saving(), Resync(at=1.0, dataplane="dp", saved=report))
    assert state.replicas["a"].saves.count("a") == 1 and "x" not in state.replicas["a"].saves
