"""Open replicas and turns a dataplane placed itself: one test per rule of the decision core."""

from __future__ import annotations

from luftpause.common.config import EndpointKind
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.events import (
    Action,
    Admit,
    ProbeResult,
    Resync,
    RunSnapshot,
    RunTaken,
)
from luftpause.scheduler.core.model import Phase, ServiceClass
from luftpause.scheduler.core.placement import open_replicas
from luftpause.scheduler.core.state import State
from tests.scheduler.helpers import IDLE, MODEL, admit, cap, endpoint, finish, placed, pool


def local(state: State, turn: str, run: str, on: str, *, model: str = MODEL) -> State:
    state, actions = decide(
        state, Admit(at=1.0, turn_id=turn, run_id=run, model=model, placed_on=on, dataplane="d")
    )
    assert placed(actions) == ({turn: on} if turn in state.turns else {})
    return state


def test_open_replicas_are_the_healthy_uncapped_generative_ones() -> None:
    state = initial_state(
        [endpoint("a"), endpoint("b"), endpoint("s", kind=EndpointKind.SINGLE_PASS)]
    )
    assert open_replicas(state) == ()
    version = state.open_version
    for rid in ("a", "b", "s"):
        state, _ = decide(state, ProbeResult(at=0.0, replica_id=rid, healthy=True, **IDLE))
    assert [r.id for r in open_replicas(state)] == ["a", "b"]
    assert state.open_version > version
    version = state.open_version
    state = cap(state, "a", running=2)
    assert [r.id for r in open_replicas(state)] == ["b"] and state.open_version > version
    version = state.open_version
    state, _ = admit(state, "t1", "r1")  # placements leave the open set alone
    assert state.open_version == version
    state, _ = decide(state, ProbeResult(at=0.0, replica_id="b", healthy=False))
    assert open_replicas(state) == () and state.open_version > version


def test_a_turn_placed_by_its_dataplane_is_counted_where_it_went() -> None:
    state = local(pool("a", "b"), "t1", "r1", on="b")
    assert state.turns["t1"].replica == "b" and state.turns["t1"].dataplane == "d"
    assert state.replicas["b"].in_flight == 1 and state.caller_in_flight[""] == 1
    assert state.runs["r1"].replica == "b" and state.runs["r1"].phase is Phase.GENERATING
    state, _ = finish(state, "t1", tool_calls=True)
    state, actions = admit(state, "t2", "r1")
    assert placed(actions) == {"t2": "b"}  # the run is pinned where its dataplane sent it


def test_a_turn_placed_on_a_replica_that_closed_meanwhile_is_counted_over_its_cap() -> None:
    state = cap(pool("a"), "a", running=1)
    state, _ = admit(state, "t1", "r1")
    state = local(state, "t2", "r2", on="a")
    assert state.replicas["a"].in_flight == 2 and state.replicas["a"].cap == 1
    state, actions = admit(state, "t3", "r3")
    assert placed(actions) == {} and "t3" in state.held
    state, actions = finish(state, "t1")
    assert placed(actions) == {}  # still at its cap: t2 holds the slot t1 freed
    state, actions = finish(state, "t2")
    assert placed(actions) == {"t3": "a"}


def test_a_placement_reported_twice_or_on_an_unknown_replica_changes_nothing() -> None:
    state = local(pool("a"), "t1", "r1", on="a")
    again, actions = decide(
        state, Admit(at=1.0, turn_id="t1", run_id="r1", model=MODEL, placed_on="a")
    )
    assert placed(actions) == {"t1": "a"} and again.replicas["a"].in_flight == 1
    for on, model in (("nowhere", MODEL), ("a", "other-model")):
        after = local(state, "t2", "r2", on=on, model=model)
        assert "t2" not in after.turns and "t2" not in after.held
        assert after.replicas["a"].in_flight == 1


def test_a_run_whose_turn_comes_through_another_dataplane_is_taken_from_the_first() -> None:
    def via_d1(state: State, turn: str, at: float) -> tuple[State, tuple[Action, ...]]:
        return decide(state, Admit(at=at, turn_id=turn, run_id="r", model=MODEL, dataplane="d1"))

    state, actions = via_d1(pool("a", "b"), "t1", 1.0)
    assert not [a for a in actions if isinstance(a, RunTaken)]  # a new run is nobody's yet
    state, _ = finish(state, "t1", tool_calls=True)
    state, actions = via_d1(state, "t2", 3.0)
    assert not [a for a in actions if isinstance(a, RunTaken)]  # the same dataplane again
    state, _ = finish(state, "t2", tool_calls=True, at=4.0)
    state = local(state, "t3", "r", on=state.runs["r"].replica)  # dataplane "d" reports one
    assert state.runs["r"].dataplane == "d"
    state, _ = finish(state, "t3", at=5.0)
    state, actions = via_d1(state, "t4", 6.0)
    assert RunTaken(dataplane="d", run_id="r") in actions
    assert state.runs["r"].dataplane == "d1"


def test_a_resync_makes_the_reporting_dataplane_the_runs_own() -> None:
    state, _ = decide(
        pool("a"),
        Resync(
            at=1.0,
            dataplane="d2",
            runs=(
                RunSnapshot(
                    run_id="r",
                    replica="a",
                    phase=Phase.TOOL_PAUSED,
                    service_class=ServiceClass.INTERACTIVE,
                    caller="",
                ),
            ),
            turns=(),
        ),
    )
    assert state.runs["r"].dataplane == "d2"
    _, actions = decide(state, Admit(at=2.0, turn_id="t", run_id="r", model=MODEL, dataplane="d3"))
    assert RunTaken(dataplane="d2", run_id="r") in actions
