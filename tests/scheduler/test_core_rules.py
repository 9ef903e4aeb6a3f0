"""One test per placement rule of the decision core. No event loop, no clock."""

from __future__ import annotations

from luftpause.common.config import Endpoint, EndpointKind, Priorities
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.events import (
    Admit,
    Place,
    ProbeResult,
    Reject,
    Resync,
    RunEnded,
    RunExpired,
    RunSnapshot,
    Tick,
    TurnAbandoned,
    TurnExpired,
    TurnFailed,
    TurnSnapshot,
)
from luftpause.scheduler.core.model import Phase, Rules, ServiceClass
from luftpause.scheduler.core.state import State
from luftpause.scheduler.core.status import status_view
from tests.scheduler.helpers import IDLE, MODEL, admit, cap, endpoint, finish, placed, pool

BATCH = ServiceClass.BATCH
HEADROOM = Rules().switched(["headroom"], on=True)


def test_unknown_model_is_rejected_at_once_and_nothing_is_held() -> None:
    state, actions = admit(pool("a"), "t1", "r1", model="nope")
    assert actions == (Reject(turn_id="t1", message="no Generative replica serves model 'nope'"),)
    assert not state.held and not state.runs


def test_turn_goes_only_to_a_replica_serving_its_model() -> None:
    state = initial_state([endpoint("a", ("x",)), endpoint("b", ("y",))])
    for rid in ("a", "b"):
        state, _ = decide(state, ProbeResult(at=0, replica_id=rid, healthy=True))
    _, actions = admit(state, "t1", "r1", model="y")
    assert placed(actions) == {"t1": "b"}


def test_unhealthy_replica_gets_nothing_and_turn_waits_for_health() -> None:
    state = pool("a", healthy=False)
    state, actions = admit(state, "t1", "r1")
    assert not placed(actions) and "t1" in state.held
    state, actions = decide(state, ProbeResult(at=2, replica_id="a", healthy=True))
    assert placed(actions) == {"t1": "a"}


def test_paused_interactive_run_returns_to_its_replica_even_when_another_has_room() -> None:
    state = pool("a", "b")
    state, actions = admit(state, "t1", "r1")
    home = placed(actions)["t1"]
    state, _ = finish(state, "t1", tool_calls=True)
    assert state.runs["r1"].phase is Phase.TOOL_PAUSED
    for i in range(5):  # load the home replica more than the other
        state, _ = admit(state, f"x{i}", f"other{i}")
    state, actions = admit(state, "t2", "r1")
    assert placed(actions) == {"t2": home}


def test_pinned_run_waits_for_its_replica_instead_of_moving() -> None:
    state = cap(cap(pool("a", "b"), "a", 1), "b", 5)
    state, actions = admit(state, "t1", "r1")
    assert placed(actions) == {"t1": "a"}  # least loaded ratio tie broken by id
    state, _ = finish(state, "t1", tool_calls=True)
    state, _ = admit(state, "t2", "other")  # fills a
    assert state.replicas["a"].in_flight == 1
    state, actions = admit(state, "t3", "r1")
    assert not placed(actions) and "t3" in state.held
    state, actions = finish(state, "t2")
    assert placed(actions) == {"t3": "a"}


def test_idle_run_may_move_when_its_replica_is_full() -> None:
    state = cap(cap(pool("a", "b"), "a", 1), "b", 5)
    state, _ = admit(state, "t1", "r1")
    state, _ = finish(state, "t1")  # idle at a
    state, _ = admit(state, "t2", "other")  # fills a
    _, actions = admit(state, "t3", "r1")
    assert placed(actions) == {"t3": "b"}


def test_idle_run_prefers_its_last_replica_when_it_has_room() -> None:
    state = pool("a", "b")
    state, _ = admit(state, "t0", "other")  # a busier than b
    state, actions = admit(state, "t1", "r1")
    home = placed(actions)["t1"]
    state, _ = finish(state, "t1")
    _, actions = admit(state, "t2", "r1")
    assert placed(actions) == {"t2": home}


def test_run_whose_replica_went_down_moves() -> None:
    state = pool("a", "b")
    state, actions = admit(state, "t1", "r1")
    home = placed(actions)["t1"]
    state, _ = finish(state, "t1", tool_calls=True)
    state, _ = decide(state, ProbeResult(at=3, replica_id=home, healthy=False))
    _, actions = admit(state, "t2", "r1", at=4)
    assert placed(actions) == {"t2": ({"a", "b"} - {home}).pop()}


def test_engine_without_queue_is_uncapped() -> None:
    state, _ = decide(
        pool("a"), ProbeResult(at=0, replica_id="a", healthy=True, running=2, waiting=0)
    )
    for i in range(50):
        state, actions = admit(state, f"t{i}", f"r{i}")
        assert placed(actions) == {f"t{i}": "a"}


def test_queueing_engine_is_capped_at_what_it_runs() -> None:
    state = cap(pool("a"), "a", 3)
    for i in range(5):
        state, _ = admit(state, f"t{i}", f"r{i}")
    assert state.replicas["a"].in_flight == 3 and len(state.held) == 2


def probe(state: State, rid: str, running: int, waiting: int) -> State:
    state, _ = decide(
        state, ProbeResult(at=0, replica_id=rid, healthy=True, running=running, waiting=waiting)
    )
    return state


def test_capped_engine_keeps_its_cap_when_its_queue_empties() -> None:
    state = probe(cap(pool("a"), "a", 3), "a", 2, 0)
    assert state.replicas["a"].cap == 3
    for i in range(5):
        state, _ = admit(state, f"t{i}", f"r{i}")
    assert state.replicas["a"].in_flight == 3 and len(state.held) == 2


def test_engine_running_at_its_cap_without_a_queue_gets_one_more_slot() -> None:
    state = cap(pool("a"), "a", 2)
    for i in range(4):
        state, _ = admit(state, f"t{i}", f"r{i}")
    state, actions = decide(
        state, ProbeResult(at=0, replica_id="a", healthy=True, running=2, waiting=0)
    )
    assert state.replicas["a"].cap == 3 and placed(actions) == {"t2": "a"}
    state, actions = decide(
        state, ProbeResult(at=0, replica_id="a", healthy=True, running=3, waiting=0)
    )
    assert state.replicas["a"].cap == 4 and placed(actions) == {"t3": "a"}
    state = probe(state, "a", 3, 1)  # seen once: a turn between arrival and the next step
    assert state.replicas["a"].cap == 4
    state = probe(state, "a", 3, 1)  # seen again: the engine cannot run it, one less
    assert state.replicas["a"].cap == 3


def test_a_lasting_queue_lowers_the_cap_but_not_below_what_runs() -> None:
    state = probe(cap(pool("a"), "a", 10), "a", 10, 0)
    state = probe(state, "a", 4, 8)
    assert state.replicas["a"].cap == 10
    state = probe(state, "a", 4, 3)
    assert state.replicas["a"].cap == 7
    state = probe(state, "a", 4, 8)
    assert state.replicas["a"].cap == 4


def test_idle_engine_is_uncapped_again() -> None:
    state = probe(cap(pool("a"), "a", 3), "a", 0, 0)
    assert state.replicas["a"].cap is None


def test_held_turn_is_placed_when_capacity_frees() -> None:
    state = cap(pool("a"), "a", 1)
    state, _ = admit(state, "t1", "r1")
    state, _ = admit(state, "t2", "r2")
    state, actions = decide(state, TurnFailed(at=3, turn_id="t1"))
    assert placed(actions) == {"t2": "a"}
    assert state.runs["r1"].phase is Phase.IDLE


def test_held_turns_drain_interactive_before_batch() -> None:
    state = cap(pool("a"), "a", 1)
    state, _ = admit(state, "t0", "r0", cls=BATCH)
    state, _ = admit(state, "b1", "rb", cls=BATCH, at=1)
    state, _ = admit(state, "i1", "ri", at=2)
    _, actions = finish(state, "t0", at=3)
    assert placed(actions) == {"i1": "a"}


def test_held_turns_drain_to_the_caller_with_fewest_turns_in_flight() -> None:
    state = cap(pool("a"), "a", 3)
    state, _ = admit(state, "f1", "rf1", caller="flood")
    state, _ = admit(state, "f2", "rf2", caller="flood")
    state, _ = admit(state, "q0", "rq0", caller="quiet")
    state, _ = admit(state, "f3", "rf3", caller="flood", at=2)
    state, _ = admit(state, "q1", "rq1", caller="quiet", at=3)
    _, actions = finish(state, "q0", at=4)
    assert placed(actions) == {"q1": "a"}  # quiet has 0 in flight, flood has 2


def test_held_turns_of_equal_standing_drain_in_arrival_order() -> None:
    state = cap(pool("a"), "a", 1)
    state, _ = admit(state, "t0", "r0", caller="c0")
    state, _ = admit(state, "t1", "r1", caller="c1", at=2)
    state, _ = admit(state, "t2", "r2", caller="c2", at=3)
    _, actions = finish(state, "t0", at=4)
    assert placed(actions) == {"t1": "a"}


def test_with_headroom_batch_leaves_a_slot_for_each_interactive_run_paused_on_a_tool() -> None:
    state = cap(pool("a", rules=HEADROOM), "a", 2)
    state, _ = admit(state, "i1", "ri")
    state, _ = finish(state, "i1", tool_calls=True)
    state, actions = admit(state, "b1", "rb1", cls=BATCH)
    assert placed(actions) == {"b1": "a"}
    state, actions = admit(state, "b2", "rb2", cls=BATCH)
    assert not placed(actions)  # the last slot is kept for ri
    _, actions = admit(state, "i2", "ri")
    assert placed(actions) == {"i2": "a"}


def test_without_headroom_batch_may_take_the_slot_a_paused_interactive_run_left() -> None:
    state = cap(pool("a"), "a", 2)
    state, _ = admit(state, "i1", "ri")
    state, _ = finish(state, "i1", tool_calls=True)
    state, actions = admit(state, "b1", "rb1", cls=BATCH)
    state, actions = admit(state, "b2", "rb2", cls=BATCH)
    assert placed(actions) == {"b2": "a"}
    state, actions = admit(state, "i2", "ri")
    assert not placed(actions)  # it waits, first in line, for the next turn to end
    _, actions = finish(state, "b1", at=3)
    assert placed(actions) == {"i2": "a"}


def test_abandoned_held_turn_leaves_the_queue_and_is_never_placed() -> None:
    state = cap(pool("a"), "a", 1)
    state, _ = admit(state, "t0", "r0")
    state, _ = admit(state, "t1", "r1")
    state, _ = decide(state, TurnAbandoned(at=2, turn_id="t1"))
    state, actions = finish(state, "t0", at=3)
    assert not placed(actions) and not state.held


def test_retried_admission_of_a_placed_turn_returns_the_same_replica() -> None:
    state, first = admit(pool("a", "b"), "t1", "r1")
    _, again = admit(state, "t1", "r1")
    assert placed(again) == placed(first)


def test_turn_never_reported_back_expires_after_ten_minutes() -> None:
    state, _ = admit(pool("a"), "t1", "r1", at=0)
    state, actions = decide(state, Tick(at=599))
    assert not actions
    state, actions = decide(state, Tick(at=600))
    assert TurnExpired(turn_id="t1", replica_id="a") in actions
    assert state.replicas["a"].in_flight == 0 and state.runs["r1"].phase is Phase.IDLE


def test_run_idle_for_thirty_minutes_is_forgotten() -> None:
    state, _ = admit(pool("a", rules=HEADROOM), "t1", "r1", at=0)
    state, _ = finish(state, "t1", tool_calls=True, at=10)
    state, actions = decide(state, Tick(at=10 + 1799))
    assert "r1" in state.runs
    state, actions = decide(state, Tick(at=10 + 1800))
    assert actions == (RunExpired(run_id="r1"),) and "r1" not in state.runs
    assert state.replicas["a"].paused_interactive == 0


def test_run_ended_forgets_the_run_and_its_headroom() -> None:
    state, _ = admit(pool("a", rules=HEADROOM), "t1", "r1")
    state, _ = finish(state, "t1", tool_calls=True)
    assert state.replicas["a"].paused_interactive == 1
    state, _ = decide(state, RunEnded(at=3, run_id="r1"))
    assert "r1" not in state.runs and state.replicas["a"].paused_interactive == 0


def test_resync_replaces_state_with_what_the_dataplane_reported() -> None:
    state = pool("a", "b", rules=HEADROOM)
    runs = (
        RunSnapshot(
            run_id="r1",
            replica="b",
            phase=Phase.TOOL_PAUSED,
            service_class=ServiceClass.INTERACTIVE,
            caller="c",
        ),
        RunSnapshot(
            run_id="r2", replica="a", phase=Phase.GENERATING, service_class=BATCH, caller="d"
        ),
    )
    turns = (
        TurnSnapshot(
            turn_id="t2", run_id="r2", replica="a", model=MODEL, service_class=BATCH, caller="d"
        ),
    )
    state, _ = decide(state, Resync(at=5, dataplane="dp", runs=runs, turns=turns))
    assert state.replicas["a"].in_flight == 1 and state.replicas["b"].paused_interactive == 1
    assert state.runs["r1"].phase is Phase.TOOL_PAUSED and state.runs["r1"].replica == "b"
    assert state.runs["r2"].turns_in_flight == 1 and state.caller_in_flight["d"] == 1
    _, actions = admit(state, "t3", "r1", at=6)
    assert placed(actions) == {"t3": "b"}


def test_single_pass_turns_never_touch_run_state_or_generative_replicas() -> None:
    state = initial_state([endpoint("g"), endpoint("s", kind=EndpointKind.SINGLE_PASS)])
    for rid in ("g", "s"):
        state, _ = decide(state, ProbeResult(at=0, replica_id=rid, healthy=True))
    state, actions = decide(
        state, Admit(at=1, turn_id="c1", run_id="", model=MODEL, single_pass=True)
    )
    assert placed(actions) == {"c1": "s"} and not state.runs and not state.caller_in_flight


def test_without_affinity_a_paused_run_moves_off_its_full_replica() -> None:
    """The benchmark ablation (runs free to move) against the default, on the same events."""
    outcomes = {}
    for affinity in (True, False):
        state = initial_state(
            [endpoint("a"), endpoint("b")],
            rules=Rules().switched(() if affinity else ("affinity", "soft_affinity"), on=False),
        )
        for rid in ("a", "b"):
            state, _ = decide(
                state, ProbeResult(at=0, replica_id=rid, healthy=True, running=2, waiting=1)
            )
        state, actions = admit(state, "t1", "r1")
        assert placed(actions) == {"t1": "a"}
        state, _ = finish(state, "t1", tool_calls=True)
        for i in range(3):  # a, b, a: the run's replica is now full, the other has room
            state, _ = admit(state, f"x{i}", f"other{i}")
        assert (state.replicas["a"].in_flight, state.replicas["b"].in_flight) == (2, 1)
        _, actions = admit(state, "t2", "r1")
        outcomes[affinity] = placed(actions)
    assert outcomes == {True: {}, False: {"t2": "b"}}


def test_placement_carries_the_engine_priority_of_the_turns_class_where_configured() -> None:
    prio = Endpoint(
        id="p",
        url="http://p:1",
        models=frozenset({MODEL}),
        priority=Priorities(interactive=0, batch=10),
    )
    state, _ = decide(
        initial_state([prio]), ProbeResult(at=0, replica_id="p", healthy=True, **IDLE)
    )
    state, first = admit(state, "t1", "r1")
    state, second = admit(state, "t2", "r2", cls=BATCH)
    _, again = admit(state, "t2", "r2", cls=BATCH)
    places = [a for a in first + second + again if isinstance(a, Place)]
    assert [(a.replica_id, a.engine_priority) for a in places] == [
        ("p", 0),
        ("p", 10),
        ("p", 10),  # a retried admission carries it too
    ]
    _, plain = admit(pool("a"), "t3", "r3")
    assert [a.engine_priority for a in plain if isinstance(a, Place)] == [None]


def _preemptive_pool(running: int) -> State:
    pre = Endpoint(
        id="p",
        url="http://p:1",
        models=frozenset({MODEL}),
        priority=Priorities(interactive=0, batch=100, preemptive=True),
    )
    state, _ = decide(initial_state([pre]), ProbeResult(at=0, replica_id="p", healthy=True))
    return cap(state, "p", running)


def test_on_a_preemptive_engine_batch_fills_the_cap_and_interactive_goes_beyond_it() -> None:
    state = _preemptive_pool(2)
    state, _ = admit(state, "i1", "ri")
    state, _ = finish(state, "i1", tool_calls=True)  # ri paused on a tool: no slot kept for it
    state, actions = admit(state, "b1", "rb1", cls=BATCH)
    state, more = admit(state, "b2", "rb2", cls=BATCH)
    assert placed(actions + more) == {"b1": "p", "b2": "p"}
    state, actions = admit(state, "b3", "rb3", cls=BATCH)
    assert not placed(actions)  # batch never beyond the cap
    state, actions = admit(state, "i2", "ri")  # the engine preempts a batch turn for it
    assert placed(actions) == {"i2": "p"}
    state, actions = admit(state, "i3", "rj")
    assert placed(actions) == {"i3": "p"}
    assert (state.replicas["p"].in_flight, state.replicas["p"].interactive_in_flight) == (4, 2)
    [view] = status_view(state, now=1.0)["replicas"]
    assert (view["in_flight"], view["interactive_in_flight"], view["capacity"]) == (4, 2, 2)
    assert view["preemptive"] is True
    state, actions = admit(state, "i4", "rk")
    assert not placed(actions)  # as many interactive turns as the cap: nothing left to preempt
    state, actions = finish(state, "b1", at=2)
    assert not placed(actions)  # the engine still runs two interactive turns
    state, actions = finish(state, "i2", at=3)
    assert placed(actions) == {"i4": "p"}  # interactive first; b3 waits for room below the cap


def test_our_turns_beyond_the_cap_queueing_do_not_lower_it() -> None:
    state = _preemptive_pool(2)
    for turn, run, cls in (("b1", "rb1", BATCH), ("b2", "rb2", BATCH), ("i1", "ri", None)):
        state, _ = admit(state, turn, run, cls=cls or ServiceClass.INTERACTIVE)
    assert state.replicas["p"].in_flight == 3
    state = probe(state, "p", 2, 1)  # the preempted batch turn waits in the engine
    state = probe(state, "p", 2, 1)
    assert state.replicas["p"].cap == 2
    state = probe(state, "p", 2, 2)  # one more than ours beyond the cap: the cap was high
    assert state.replicas["p"].cap == 2  # never below what runs


def test_a_batch_placement_that_moves_a_run_takes_its_held_interactive_turn_along() -> None:
    # Found by the state machine once slots made b full: the batch pass of a drain moved run
    # r0 to a, which re-bucketed r0's held interactive turn after the interactive pass was over.
    state = initial_state([endpoint("a", ("m1", "m2")), endpoint("b", ("m1",))])
    state, _ = decide(state, ProbeResult(at=0.0, replica_id="b", healthy=True, **IDLE))
    state = cap(state, "b", 1)
    state, actions = admit(state, "t1", "r0", model="m1")
    assert placed(actions) == {"t1": "b"}
    state, _ = admit(state, "t2", "r0", model="m1")  # pinned to b, which is full
    state, _ = admit(state, "t3", "r0", model="m2", cls=BATCH)  # only a serves m2: down
    state, actions = decide(state, ProbeResult(at=2.0, replica_id="a", healthy=True, **IDLE))
    assert placed(actions) == {"t3": "a", "t2": "a"} and not state.held
