"""Rate-limit waits played forward (`rate_waits`): pure, no event loop."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from luftpause.runtime.core.rate_waits import Demand, Dimension, Playback, Window, windows_for

TURN = Demand(prompt=800, completion=200)


def window(available: float, *, limit: float = 3000, refill_s: float = 20.0, **kw: Any) -> Window:
    dims = (Dimension(name="tokens", limit=limit, available=available, refill_s=refill_s),)
    return Window(id="endpoint:hosted", dimensions=dims, **kw)


def test_turns_that_fit_the_window_never_wait() -> None:
    playback = Playback([window(3000)])
    assert [playback.take(k, TURN, t=k * 1.0) for k in (1, 2, 3)] == [0.0, 0.0, 0.0]


def test_a_turn_past_a_fixed_window_waits_for_its_reset_then_the_next_period() -> None:
    playback = Playback([window(1500, refill_s=20.0)])
    assert playback.take(1, TURN, t=0.0) == 0.0  # 500 left
    assert playback.take(2, TURN, t=1.0) == 19.0  # until the reset at 20 s: 3000 again
    assert playback.take(3, TURN, t=21.0) == 0.0
    assert playback.take(4, TURN, t=22.0) == 0.0  # 0 left
    assert playback.take(5, TURN, t=23.0) == 57.0  # the next reset, a minute after the first


def test_a_bucket_refills_at_its_rate() -> None:
    playback = Playback([window(1000, limit=6000, regime="continuous")])  # 100 tokens/s
    assert playback.take(1, TURN, t=0.0) == 0.0
    assert playback.take(2, TURN, t=0.0) == 10.0


def test_reservations_of_others_count_against_the_window() -> None:
    dims = (Dimension(name="tokens", limit=3000, available=1500, reserved=1000, refill_s=5.0),)
    assert Playback([Window(id="w", dimensions=dims)]).take(1, TURN, t=0.0) == 5.0


def test_a_turn_larger_than_the_window_or_a_spent_day_is_blocked_not_waited_for() -> None:
    big = Playback([window(900, limit=900)])
    assert big.take(1, TURN, t=0.0) == 0.0 and big.blocked is not None
    assert big.blocked.at_step == 1
    daily = Dimension(name="daily_tokens", limit=1500, available=1500, refill_s=-1.0)
    day = Playback([Window(id="key:team-a", kind="key", dimensions=(daily,))])
    assert day.take(1, TURN, t=0.0) == 0.0 and day.blocked is None
    day.take(2, TURN, t=1.0)
    assert day.blocked is not None and (day.blocked.window, day.blocked.at_step) == (
        "key:team-a",
        2,
    )


def test_requests_and_input_output_budgets_count_their_own_part() -> None:
    assert [TURN.cost(d) for d in ("requests", "input_tokens", "output_tokens", "tokens")] == [
        1.0,
        800,
        200,
        1000,
    ]


@given(
    available=st.floats(0, 5000),
    refill=st.floats(0, 60),
    continuous=st.booleans(),
    turns=st.lists(st.integers(1, 3000), min_size=1, max_size=12),
)
def test_a_wait_is_never_negative_and_a_turn_that_can_fit_never_blocks(
    available: float, refill: float, continuous: bool, turns: list[int]
) -> None:
    """Invariant: every wait is finite and >= 0 while each turn is within the window's limit."""
    playback = Playback(
        [
            window(
                available,
                limit=3000,
                refill_s=refill,
                regime="fixed" if not continuous else "continuous",
            )
        ]
    )
    t = 0.0
    for k, tokens in enumerate(turns, 1):
        wait = playback.take(k, Demand(prompt=tokens, completion=0), t)
        assert wait >= 0 and math.isfinite(wait)
        t += wait + 1.0
    assert playback.blocked is None


def test_a_run_counts_against_its_keys_window_and_the_roomiest_endpoint_serving_its_model() -> None:
    def dims(available: int) -> list[dict[str, Any]]:
        return [{"name": "tokens", "limit": 1000, "available": available, "reserved": 0}]

    status = {
        "replicas": [
            {"id": "a", "models": ["gpt"]},
            {"id": "b", "models": ["gpt"]},
            {"id": "c", "models": ["other"]},
        ],
        "budgets": [
            {"id": "endpoint:a", "kind": "endpoint", "replicas": ["a"], "dimensions": dims(100)},
            {"id": "endpoint:b", "kind": "endpoint", "replicas": ["b"], "dimensions": dims(900)},
            {"id": "endpoint:c", "kind": "endpoint", "replicas": ["c"], "dimensions": dims(1000)},
            {"id": "key:team-a", "kind": "key", "replicas": [], "dimensions": dims(500)},
            {"id": "key:team-b", "kind": "key", "replicas": [], "dimensions": dims(500)},
            {"kind": "broken"},
        ],
    }
    assert [w.id for w in windows_for(status, "gpt", "team-a")] == ["endpoint:b", "key:team-a"]
    assert [w.id for w in windows_for(status, "gpt", None)] == ["endpoint:b"]
    assert windows_for(status, "unknown", None) == []
