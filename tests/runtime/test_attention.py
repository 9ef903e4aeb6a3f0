"""The attention budget's pure core: questions per session per rolling hour, away switches,
and the order waiting questions are asked in. No event loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from luftpause.runtime.core import attention as a

HOUR = a.WINDOW


def asking(state: a.Attention, session: str, key: str, now: float) -> tuple[a.Attention, bool]:
    """Ask if allowed, as the shell does: the new state and whether it was asked."""
    if a.hold(state, session, key, now) is None:
        return a.asked(state, session, key, now), True
    return state, False


def test_a_session_is_asked_at_most_n_questions_per_rolling_hour() -> None:
    state = a.Attention(per_hour=2)
    state, first = asking(state, "s", "r1/c1", 0.0)
    state, second = asking(state, "s", "r2/c1", 10.0)
    state, third = asking(state, "s", "r3/c1", 20.0)
    assert (first, second, third) == (True, True, False)
    assert a.hold(state, "s", "r3/c1", 20.0) == a.Hold(reason="budget", until=HOUR)


def test_the_budget_frees_when_the_oldest_ask_leaves_the_window() -> None:
    state = a.Attention(per_hour=2)
    state = a.asked(a.asked(state, "s", "r1/c1", 0.0), "s", "r2/c1", 600.0)
    assert a.hold(state, "s", "r3/c1", HOUR - 1) is not None
    assert a.hold(state, "s", "r3/c1", HOUR) is None  # the ask at 0 is out of the window
    state = a.asked(state, "s", "r3/c1", HOUR)
    assert a.hold(state, "s", "r4/c1", HOUR + 1) == a.Hold(reason="budget", until=600.0 + HOUR)


def test_a_question_shown_again_costs_nothing() -> None:
    state = a.asked(a.Attention(per_hour=1), "s", "r1/c1", 0.0)
    assert a.hold(state, "s", "r1/c1", 5.0) is None
    again = a.asked(state, "s", "r1/c1", 5.0)
    assert a.view(again, "s", 5.0)["askedLastHour"] == 1
    assert a.hold(again, "s", "r2/c1", 5.0) == a.Hold(reason="budget", until=5.0 + HOUR)


def test_zero_per_hour_never_asks() -> None:
    state = a.Attention(per_hour=0)
    assert a.hold(state, "s", "r1/c1", 0.0) == a.Hold(reason="budget", until=None)


def test_sessions_have_budgets_of_their_own() -> None:
    state = a.asked(a.Attention(per_hour=1), "alice", "r1/c1", 0.0)
    assert a.hold(state, "alice", "r2/c1", 1.0) is not None
    assert a.hold(state, "bob", "r2/c1", 1.0) is None


def test_away_holds_every_question_of_the_session_until_it_is_switched_off() -> None:
    state = a.set_away(a.Attention(), "alice", True)
    assert a.hold(state, "alice", "r1/c1", 0.0) == a.Hold(reason="away")
    assert a.hold(state, "bob", "r1/c1", 0.0) is None
    state = a.set_away(state, "alice", False)
    assert a.hold(state, "alice", "r1/c1", 0.0) is None


def test_away_for_everyone_holds_every_session_and_even_a_question_asked_before() -> None:
    state = a.asked(a.Attention(), "alice", "r1/c1", 0.0)
    state = a.set_away(state, a.EVERYONE, True)
    assert a.hold(state, "alice", "r1/c1", 1.0) == a.Hold(reason="away")
    assert a.hold(state, "bob", "r2/c1", 1.0) == a.Hold(reason="away")
    assert a.view(state, "bob", 1.0)["awayEveryone"] is True


def test_the_view_says_how_many_were_asked_and_when_the_next_may_be() -> None:
    state = a.asked(a.Attention(per_hour=1), "s", "r1/c1", 100.0)
    assert a.view(state, "s", 200.0) == {
        "session": "s",
        "away": False,
        "awayEveryone": False,
        "perHour": 1,
        "askedLastHour": 1,
        "mayAsk": False,
        "nextAskAt": 100.0 + HOUR,
    }


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 0"):
        a.Attention(per_hour=-1)


def waiting(handle: str, call: str, since: float, arguments: str = "{}") -> a.Waiting:
    return a.Waiting(handle=handle, call_id=call, tool="t", arguments=arguments, since=since)


def test_waiting_questions_are_asked_oldest_first_ties_by_run_and_call() -> None:
    found = [waiting("r2", "c1", 5.0), waiting("r1", "c2", 1.0), waiting("r1", "c1", 1.0)]
    assert [w.key for w in a.oldest_first(found)] == ["r1/c1", "r1/c2", "r2/c1"]


def test_a_waiting_question_shows_its_run_tool_arguments_and_age() -> None:
    long = '{"text": "' + "x" * 500 + '"}'
    shown = a.describe(waiting("r1", "c1", 10.0, long), 12.5)
    assert shown["handle"] == "r1" and shown["callId"] == "c1" and shown["tool"] == "t"
    assert shown["since"] == 10.0 and shown["waitingSeconds"] == 2.5
    assert str(shown["arguments"]).endswith("…")
    assert len(str(shown["arguments"])) == a.ARGUMENTS_SHOWN + 1


@given(
    per_hour=st.integers(min_value=0, max_value=5),
    steps=st.lists(
        st.tuples(st.floats(min_value=0, max_value=2000), st.integers(0, 3), st.integers(0, 9)),
        max_size=60,
    ),
)
def test_no_session_is_ever_asked_more_than_its_budget_in_any_hour(
    per_hour: int, steps: list[tuple[float, int, int]]
) -> None:
    """Invariant: in every window of an hour, each session was asked at most `per_hour`
    different questions, whatever the order of attempts."""
    state = a.Attention(per_hour=per_hour)
    now = 0.0
    log: list[tuple[str, str, float]] = []
    for gap, session_no, question in steps:
        now += gap
        session, key = f"s{session_no}", f"r{question}/c"
        state, was_asked = asking(state, session, key, now)
        if was_asked:
            log.append((session, key, now))
    for session, _, at in log:
        recent = {k for s, k, t in log if s == session and at - HOUR < t <= at}
        assert len(recent) <= per_hour


def test_replaying_the_records_of_a_state_gives_its_budget_and_switches() -> None:
    """Invariant: `records` then `replay` keep each session's asks in the window and every
    switch, so a restarted runtime asks no more than the hour allows."""
    state = a.Attention(per_hour=3)
    for at, session, key in [(10.0, "alice", "r/1"), (20.0, "bob", "r/2"), (30.0, "alice", "r/3")]:
        state = a.asked(state, session, key, at)
    state = a.set_away(a.set_away(state, "carol", True), a.EVERYONE, True)
    again = a.replay(a.Attention(per_hour=3), a.records(state, 40.0))
    for session in ("alice", "bob", "carol"):
        assert a.view(again, session, 40.0) == a.view(state, session, 40.0)
    assert again.asked_by("alice", 40.0) == state.asked_by("alice", 40.0)
    assert again.away == state.away


def test_replay_applies_asks_and_switches_in_order_and_skips_other_records() -> None:
    records = [
        a.away_record("alice", True),
        {"v": 2, "type": "spawned", "run": "x"},
        a.asked_record("bob", "r/1", 5.0),
        a.away_record("alice", False),
    ]
    state = a.replay(a.Attention(), records)
    assert not state.is_away("alice") and [x.key for x in state.asked_by("bob", 6.0)] == ["r/1"]
