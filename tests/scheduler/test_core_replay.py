"""Replay determinism: the same events in the same order give the same decisions and state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.common.config import Endpoint
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.events import (
    Action,
    Admit,
    Event,
    ProbeResult,
    RunEnded,
    Tick,
    TurnFailed,
    TurnFinished,
)
from luftpause.scheduler.core.model import ServiceClass
from luftpause.scheduler.core.state import State

ENDPOINTS = [Endpoint(id=r, url=f"http://{r}:1", models=frozenset({"m"})) for r in "ab"]


def _event(kind: str, n: int, at: float, flag: bool) -> Event:
    turn, run = f"t{n % 12}", f"r{n % 5}"
    if kind == "admit":
        cls = ServiceClass.BATCH if flag else ServiceClass.INTERACTIVE
        return Admit(
            at=at, turn_id=f"t{n}", run_id=run, model="m", service_class=cls, caller=f"c{n % 3}"
        )
    if kind == "finish":
        return TurnFinished(at=at, turn_id=turn, tool_calls=flag)
    if kind == "fail":
        return TurnFailed(at=at, turn_id=turn)
    if kind == "probe":
        return ProbeResult(
            at=at, replica_id="ab"[n % 2], healthy=flag or n % 3 > 0, running=n % 4, waiting=n % 2
        )
    if kind == "end":
        return RunEnded(at=at, run_id=run)
    return Tick(at=at)


events = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "finish", "fail", "probe", "end", "tick"]),
        st.integers(0, 40),
        st.floats(0, 900),
        st.booleans(),
    ),
    max_size=80,
).map(
    lambda raw: [
        _event(k, n, sum(r[2] for r in raw[: i + 1]), f) for i, (k, n, _, f) in enumerate(raw)
    ]
)


def _replay(sequence: list[Event]) -> tuple[State, list[Action]]:
    state = initial_state(ENDPOINTS)
    out: list[Action] = []
    for ev in sequence:
        state, actions = decide(state, ev)
        out.extend(actions)
    return state, out


@settings(max_examples=150, deadline=None)
@given(events)
def test_same_events_give_the_same_decisions_and_state(sequence: list[Event]) -> None:
    """Invariant: decide() is a function of (state, event) alone, so replay reproduces."""
    first_state, first_actions = _replay(sequence)
    second_state, second_actions = _replay(sequence)
    assert first_actions == second_actions
    assert first_state == second_state


def test_decide_never_changes_the_state_it_was_given() -> None:
    state = initial_state(ENDPOINTS)
    state, _ = decide(state, ProbeResult(at=0, replica_id="a", healthy=True))
    before = (state.held, state.turns, state.runs, state.replicas, state.next_seq)
    decide(state, Admit(at=1, turn_id="t", run_id="r", model="m"))
    assert (state.held, state.turns, state.runs, state.replicas, state.next_seq) == before
