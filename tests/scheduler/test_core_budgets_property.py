"""Admission by budget under any sequence of events: reservations never leak nor overspend.

Hypothesis drives the decision core through admissions (with and without a caller key's budget),
turn ends with and without readings, 429s, abandoned held turns and the clock, on a pool of two
rate-limited endpoints and one that is not. After every step: each window's sum of uncounted
reservations equals its rebuild from the reservations, every reservation belongs to a turn in
flight or queued, no turn is both held for a window and placed, and no window admitted more than
its level allowed at the moment it admitted.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.common.config import Endpoint
from luftpause.common.limits import Limits
from luftpause.common.ratelimits import Budget, Reading
from luftpause.scheduler.core import windows as w
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.events import (
    Admit,
    Event,
    Place,
    ProbeResult,
    Tick,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
)
from luftpause.scheduler.core.model import KeyLimits, ServiceClass
from luftpause.scheduler.core.state import State
from tests.scheduler.helpers import MODEL

KEY = KeyLimits(name="team", tokens_per_minute=2000, requests_per_minute=30)

Op = tuple[str, int, int]
ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["admit", "admit_key", "finish", "finish_read", "refused", "abandon", "tick"]
        ),
        st.integers(0, 30),
        st.integers(0, 3),
    ),
    max_size=80,
)


def _pool() -> State:
    endpoints = [
        Endpoint(id="a", url="http://a:1", models=frozenset({MODEL}), limits=Limits(tpm=3000)),
        Endpoint(id="b", url="http://b:1", models=frozenset({MODEL}), limits=Limits()),
        Endpoint(id="local", url="http://l:1", models=frozenset({"other"})),
    ]
    state = initial_state(endpoints)
    for e in endpoints:
        state, _ = decide(state, ProbeResult(at=0.0, replica_id=e.id, healthy=True))
    return state


def _event(state: State, op: Op, at: float) -> Event | None:
    kind, n, size = op
    turn = f"t{n}"
    if kind in ("admit", "admit_key"):
        return Admit(
            at=at,
            turn_id=turn,
            run_id=f"r{n % 7}",
            model=MODEL if n % 5 else "other",
            service_class=ServiceClass.BATCH if size % 2 else ServiceClass.INTERACTIVE,
            prompt_bytes=400 * (size + 1),
            max_tokens=64,
            key=KEY if kind == "admit_key" else None,
        )
    if kind == "abandon":
        return TurnAbandoned(at=at, turn_id=turn)
    if kind == "tick":
        return Tick(at=at)
    placed = state.turns.get(turn)
    if placed is None:
        return None
    left = Reading(
        budgets={"tokens": Budget(limit=3000, remaining=max(0, 2500 - 300 * size), reset_s=5.0)}
    )
    if kind == "refused":
        return TurnFailed(
            at=at, turn_id=turn, reading=Reading(retry_after_s=2.0), reading_at=at, refused=True
        )
    return TurnFinished(
        at=at,
        turn_id=turn,
        prompt_tokens=100 * (size + 1),
        completion_tokens=40,
        reading=left if kind == "finish_read" else None,
        reading_at=at,
    )


def _check(before: State, state: State, placed: list[Place], at: float) -> None:
    for window in state.windows.values():
        assert window.uncounted == w.rebuild_uncounted(window), f"{window.id}: uncounted drifts"
        for turn_id in window.pending:
            assert turn_id in state.turns or turn_id in state.held, f"{turn_id} leaked"
    assert not set(state.budget_held) & set(state.turns), "a turn both held and placed"
    for place in placed:
        if place.turn_id in before.turns:
            continue  # an admission sent again: the placement it had, nothing new reserved
        wid = before.window_of.get(place.replica_id)
        prior = None if wid is None else before.windows.get(wid)
        if wid is None or prior is None or not prior.levels:
            continue
        # What it admitted was available at the moment (refills included) before it did.
        cost = state.windows[wid].pending[place.turn_id].cost
        level = w.advance(prior, at)
        left = w.available(level, "tokens", at)
        assert left is None or left >= min(cost[1], level.levels["tokens"].limit) - 1e-6


@settings(max_examples=150, deadline=None)
@given(ops)
def test_reservations_never_leak_and_no_window_admits_past_its_level(steps: list[Op]) -> None:
    state = _pool()
    at = 1.0
    for op in steps:
        at += 0.25 * (op[2] + 1) if op[0] == "tick" else 0.01
        event = _event(state, op, at)
        if event is None:
            continue
        before = state
        state, actions = decide(state, event)
        placed = [a for a in actions if isinstance(a, Place)]
        if len(placed) == 1 or isinstance(event, Admit):
            _check(before, state, placed[:1], at)
        else:
            _check(before, state, [], at)
    # Every turn ends (an end may place a held turn: again, until none is left).
    while state.turns or state.held or state.budget_held:
        for turn_id in list(state.held) + list(state.budget_held):
            state, _ = decide(state, TurnAbandoned(at=at, turn_id=turn_id))
        for turn_id in list(state.turns):
            state, _ = decide(state, TurnFinished(at=at, turn_id=turn_id, prompt_tokens=1))
    for window in state.windows.values():
        assert not window.pending and window.uncounted == w.NO_COST
