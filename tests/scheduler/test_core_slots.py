"""Engine slots (endpoint `slots`): which llama.cpp slot each placed turn names. No I/O."""

from __future__ import annotations

from dataclasses import replace

import pytest

from luftpause.common.config import ConfigError, EndpointKind, parse_config
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.events import (
    Action,
    Admit,
    Place,
    ProbeResult,
    Resync,
    RunEnded,
    TurnFailed,
    TurnSnapshot,
)
from luftpause.scheduler.core.model import ServiceClass
from luftpause.scheduler.core.placement import open_replicas
from luftpause.scheduler.core.state import State
from luftpause.scheduler.core.status import status_view
from tests.scheduler.helpers import IDLE, MODEL, admit, cap, endpoint, finish, placed

BATCH = ServiceClass.BATCH


def slotted(*ids: str, slots: int = 2) -> State:
    state = initial_state(replace(endpoint(i), slots=slots) for i in ids)
    for i in ids:
        state, _ = decide(state, ProbeResult(at=0.0, replica_id=i, healthy=True))
    return state


def slot_of(actions: tuple[Action, ...], turn: str) -> int | None:
    [place] = [a for a in actions if isinstance(a, Place) and a.turn_id == turn]
    return place.engine_slot


def test_a_run_gets_its_own_slot_back_after_other_runs_used_the_others() -> None:
    state = slotted("a", slots=3)
    state, actions = admit(state, "t1", "r1")
    assert slot_of(actions, "t1") == 0
    state, _ = finish(state, "t1", tool_calls=True)
    for i, run in enumerate(("r2", "r3")):
        state, actions = admit(state, f"u{i}", run)
        assert slot_of(actions, f"u{i}") == i + 1
        state, _ = finish(state, f"u{i}", tool_calls=True)
    state, actions = admit(state, "t2", "r1", at=5.0)
    assert slot_of(actions, "t2") == 0
    assert state.turns["t2"].slot == 0 and state.replicas["a"].busy_slots == {0}


def test_no_more_turns_in_flight_than_slots_even_while_the_engine_reports_no_queue() -> None:
    state = slotted("a", slots=2)
    assert not open_replicas(state)  # a dataplane never places turns there itself
    state, a1 = admit(state, "t1", "r1")
    state, a2 = admit(state, "t2", "r2")
    state, a3 = admit(state, "t3", "r3")
    assert {slot_of(a1, "t1"), slot_of(a2, "t2")} == {0, 1}
    assert not placed(a3) and "t3" in state.held
    state, actions = finish(state, "t1")
    assert slot_of(actions, "t3") == 0  # the slot t1 left
    assert status_view(state, 3.0)["replicas"][0]["capacity"] == 2


def test_a_new_run_overwrites_a_finished_run_before_a_paused_one() -> None:
    state = slotted("a", slots=2)
    state, _ = admit(state, "t1", "paused")
    state, _ = admit(state, "t2", "done")
    state, _ = finish(state, "t1", tool_calls=True, at=2.0)
    state, _ = finish(state, "t2", tool_calls=False, at=3.0)  # its last turn: likely done
    state, actions = admit(state, "t3", "new", at=4.0)
    assert slot_of(actions, "t3") == 1
    assert state.replicas["a"].slot_runs == ("paused", "new")


def test_paused_runs_lose_their_slot_batch_first_then_the_latest_paused() -> None:
    state = slotted("a", slots=3)
    runs = [("i-old", ServiceClass.INTERACTIVE), ("b-new", BATCH), ("b-old", BATCH)]
    for n, (run, cls) in enumerate(runs):
        state, _ = admit(state, f"t{n}", run, cls=cls)
    # Paused in this order: i-old, b-old, b-new. With tools that take about as long, the run
    # paused last comes back last: its context is wanted last.
    for turn, at in (("t0", 2.0), ("t2", 3.0), ("t1", 4.0)):
        state, _ = finish(state, turn, tool_calls=True, at=at)
    state, actions = admit(state, "x1", "new1", at=5.0)
    assert slot_of(actions, "x1") == 1  # b-new's
    state, actions = admit(state, "x2", "new2", at=5.0)
    assert slot_of(actions, "x2") == 2  # b-old's; the interactive run keeps its slot
    state, actions = admit(state, "t9", "i-old", at=6.0)
    assert slot_of(actions, "t9") == 0


def test_a_run_whose_next_turn_is_held_keeps_its_slot_over_one_still_in_its_tool() -> None:
    # Three slots, but the engine queued, so only one turn at a time. a's next turn waits
    # behind a new run's; x, paused last, is still in its tool: its slot goes to the new run.
    state = slotted("a", slots=3)
    for turn, run in (("a1", "a"), ("b1", "b"), ("x1", "x")):
        state, _ = admit(state, turn, run, cls=BATCH)
    state, _ = finish(state, "a1", tool_calls=True, at=2.0)
    state, _ = finish(state, "b1", tool_calls=True, at=3.0)
    state = cap(state, "a", 1, at=4.0)
    state, _ = admit(state, "n1", "new", cls=BATCH, at=4.5)
    state, _ = admit(state, "a2", "a", cls=BATCH, at=4.6)
    assert {"n1", "a2"} <= set(state.held)
    state, actions = finish(state, "x1", tool_calls=True, at=5.0)
    assert placed(actions) == {"n1": "a"} and slot_of(actions, "n1") == 2  # x's
    assert state.replicas["a"].slot_runs == ("a", "b", "new")


def test_a_forgotten_run_or_one_gone_elsewhere_frees_its_slot_first() -> None:
    state = slotted("a", "b", slots=2)
    state, actions = admit(state, "t1", "gone")
    assert placed(actions) == {"t1": "a"}
    state, actions = admit(state, "t2", "paused")
    assert placed(actions) == {"t2": "b"}
    state, actions = admit(state, "t3", "paused2")
    assert placed(actions) == {"t3": "a"}
    for turn in ("t1", "t2", "t3"):
        state, _ = finish(state, turn, tool_calls=True)
    state, _ = decide(state, RunEnded(at=3.0, run_id="gone"))
    state, actions = admit(state, "t4", "new", at=4.0)
    assert placed(actions) == {"t4": "a"} and slot_of(actions, "t4") == 0  # gone's slot


def test_a_failed_turn_frees_its_slot_and_the_slot_keeps_its_run() -> None:
    state = slotted("a", slots=1)
    state, _ = admit(state, "t1", "r1")
    state, _ = decide(state, TurnFailed(at=2.0, turn_id="t1", reason="engine said no"))
    assert state.replicas["a"].busy_slots == frozenset()
    assert state.replicas["a"].slot_runs == ("r1",)
    state, actions = admit(state, "t2", "r1")
    assert slot_of(actions, "t2") == 0


def test_a_retried_admission_names_the_same_slot() -> None:
    state = slotted("a", slots=2)
    state, _ = admit(state, "t1", "r1")
    state, actions = admit(state, "t2", "r2")
    state, again = admit(state, "t2", "r2")
    assert slot_of(again, "t2") == slot_of(actions, "t2") == 1


def test_replicas_without_slots_name_none() -> None:
    state = initial_state([endpoint("a")])
    state, _ = decide(state, ProbeResult(at=0.0, replica_id="a", healthy=True, **IDLE))
    state, actions = admit(state, "t1", "r1")
    assert slot_of(actions, "t1") is None and state.replicas["a"].capacity is None


def test_resync_keeps_the_slots_of_turns_it_placed_and_not_of_turns_it_never_saw() -> None:
    state = slotted("a", slots=2)
    state, _ = decide(
        state,
        Admit(at=1.0, turn_id="t1", run_id="r1", model=MODEL, service_class=BATCH, dataplane="dp"),
    )
    snap = TurnSnapshot(
        turn_id="t1", run_id="r1", replica="a", model=MODEL, service_class=BATCH, caller=""
    )
    other = replace(snap, turn_id="t2", run_id="r2")
    state, _ = decide(state, Resync(at=2.0, dataplane="dp", turns=(snap, other), runs=()))
    assert state.turns["t1"].slot == 0 and state.turns["t2"].slot == -1
    assert state.replicas["a"].busy_slots == {0} and state.replicas["a"].in_flight == 2


def test_the_config_takes_slots_for_generative_endpoints_only() -> None:
    raw = {"id": "a", "url": "http://a:1", "models": ["m"], "slots": 4}
    assert parse_config({"endpoints": [raw]}).endpoints[0].slots == 4
    for bad in (-1, "4", True, 1.5):
        with pytest.raises(ConfigError, match="slots"):
            parse_config({"endpoints": [{**raw, "slots": bad}]})
    with pytest.raises(ConfigError, match="generative"):
        replace(endpoint("a"), slots=2, kind=EndpointKind.SINGLE_PASS)
