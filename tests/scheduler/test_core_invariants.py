"""Hypothesis stateful test of the decision core's invariants.

After every step of a random sequence of admits, ends, failures, abandons, probes, run ends and
ticks:

- never over capacity: a capped replica that received a turn holds at most its cap;
- never on an unhealthy replica, nor on one that does not serve the turn's model;
- a generating or tool-paused run's turn goes to its replica while that replica is healthy;
- every held turn is placed once capacity allows: after a step, no held turn could be placed;
- derived counters (in flight per replica and per caller, paused-interactive headroom) equal
  what the turns and runs themselves say.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from luftpause.common.config import Endpoint
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.model import (
    Action,
    Admit,
    Event,
    Phase,
    Place,
    ProbeResult,
    RunEnded,
    ServiceClass,
    State,
    Tick,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
)
from luftpause.scheduler.core.placement import choose_replica

REPLICAS = {"a": {"m1", "m2"}, "b": {"m1"}, "c": {"m2"}}
RUNS = [f"r{i}" for i in range(8)]
CALLERS = ["x", "y", "z"]


def _may_unpin(before: State, event: Event, run_id: str) -> bool:
    """Whether `event` itself may legitimately leave the run idle or forget it."""
    if isinstance(event, Tick):
        return True
    if isinstance(event, RunEnded):
        return event.run_id == run_id
    if isinstance(event, TurnFinished | TurnFailed | TurnAbandoned):
        turn = before.turns.get(event.turn_id)
        return turn is not None and turn.run_id == run_id
    return False


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        endpoints = [
            Endpoint(id=r, url=f"http://{r}:1", models=frozenset(m)) for r, m in REPLICAS.items()
        ]
        self.state: State = initial_state(endpoints)
        self.now = 0.0
        self.turn_no = 0

    def step(self, event: Event) -> None:
        before = self.state
        self.state, actions = decide(before, event)
        self.check_placements(before, event, actions)

    def check_placements(self, before: State, event: Event, actions: tuple[Action, ...]) -> None:
        after = self.state
        for action in actions:
            if not isinstance(action, Place):
                continue
            replica = after.replicas[action.replica_id]
            turn = after.turns[action.turn_id]
            assert replica.healthy, "placed on an unhealthy replica"
            assert turn.model in replica.models, "placed on a replica without the model"
            if replica.capacity is not None:
                assert replica.in_flight <= replica.capacity, "over capacity"
            run = before.runs.get(turn.run_id)
            if run is not None and run.pinned and not _may_unpin(before, event, run.id):
                home = after.replicas.get(run.replica)
                if home is not None and home.healthy and turn.model in home.models:
                    assert action.replica_id == run.replica, "pinned run moved"

    @rule(
        run=st.sampled_from(RUNS),
        caller=st.sampled_from(CALLERS),
        batch=st.booleans(),
        model=st.sampled_from(["m1", "m2"]),
        dt=st.floats(0, 5),
    )
    def admit(self, run: str, caller: str, batch: bool, model: str, dt: float) -> None:
        self.now += dt
        self.turn_no += 1
        cls = ServiceClass.BATCH if batch else ServiceClass.INTERACTIVE
        self.step(
            Admit(
                at=self.now,
                turn_id=f"t{self.turn_no}",
                run_id=run,
                model=model,
                service_class=cls,
                caller=caller,
            )
        )

    @precondition(lambda self: bool(self.state.turns))
    @rule(data=st.data(), tool_calls=st.booleans(), how=st.sampled_from(["ok", "fail", "gone"]))
    def end_turn(self, data: st.DataObject, tool_calls: bool, how: str) -> None:
        turn_id = data.draw(st.sampled_from(sorted(self.state.turns)))
        self.now += 0.5
        event: Event
        if how == "ok":
            event = TurnFinished(at=self.now, turn_id=turn_id, tool_calls=tool_calls)
        elif how == "fail":
            event = TurnFailed(at=self.now, turn_id=turn_id)
        else:
            event = TurnAbandoned(at=self.now, turn_id=turn_id)
        self.step(event)

    @precondition(lambda self: bool(self.state.held))
    @rule(data=st.data())
    def abandon_held(self, data: st.DataObject) -> None:
        turn_id = data.draw(st.sampled_from(sorted(self.state.held)))
        self.step(TurnAbandoned(at=self.now, turn_id=turn_id))

    @rule(
        replica=st.sampled_from(sorted(REPLICAS)),
        healthy=st.booleans(),
        running=st.none() | st.integers(0, 4),
        waiting=st.none() | st.integers(0, 3),
    )
    def probe(self, replica: str, healthy: bool, running: int | None, waiting: int | None) -> None:
        self.step(
            ProbeResult(
                at=self.now, replica_id=replica, healthy=healthy, running=running, waiting=waiting
            )
        )

    @rule(run=st.sampled_from(RUNS))
    def end_run(self, run: str) -> None:
        self.step(RunEnded(at=self.now, run_id=run))

    @rule(dt=st.sampled_from([1.0, 700.0, 2000.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.step(Tick(at=self.now))

    @invariant()
    def no_held_turn_could_be_placed(self) -> None:
        for turn in self.state.held.values():
            assert choose_replica(self.state, turn) is None, f"{turn.id} left waiting"

    @invariant()
    def counters_match_turns_and_runs(self) -> None:
        s = self.state
        per_replica = Counter(t.replica for t in s.turns.values())
        per_caller = Counter(t.caller for t in s.turns.values() if not t.single_pass)
        paused = Counter(
            r.replica
            for r in s.runs.values()
            if r.phase is Phase.TOOL_PAUSED and r.service_class is ServiceClass.INTERACTIVE
        )
        for rid, replica in s.replicas.items():
            assert replica.in_flight == per_replica[rid]
            assert replica.paused_interactive == paused[rid]
        assert dict(s.caller_in_flight.items()) == dict(per_caller)
        per_run = Counter(t.run_id for t in s.turns.values())
        for run in s.runs.values():
            assert run.turns_in_flight == per_run[run.id]
            assert (run.phase is Phase.GENERATING) == (run.turns_in_flight > 0)


CoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestCoreInvariants = CoreMachine.TestCase
