"""The simulator's hosted-API budgets: fixed windows and token buckets, in simulated time.

Pure: no event loop, the time is an argument. Durations a verdict reports are real seconds
(simulated seconds divided by the time scale).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from luftpause.testkit.engine.ratelimit import (
    Cost,
    RateLimiter,
    Regime,
    parse_limits,
)


def tokens(n: int, out: int = 0) -> Cost:
    return Cost(input_tokens=n, output_tokens=out)


def remaining(limiter: RateLimiter, now_s: float) -> dict[str, int]:
    return {v.name: v.remaining for v in limiter.views(now_s)}


def test_the_request_budget_refuses_past_the_limit_and_refills_next_window() -> None:
    limiter = RateLimiter(rpm=2, regime="fixed", time_scale=10.0)
    assert limiter.check(1.0, tokens(10)).allowed
    ok = limiter.check(2.0, tokens(10))
    assert ok.headers["x-ratelimit-remaining-requests"] == "0"
    refused = limiter.check(30.0, tokens(10))
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(3.0)  # 30 simulated seconds at 10x
    assert refused.headers["x-ratelimit-reset-requests"] == "3s"
    assert "requests" in refused.message
    assert limiter.check(61.0, tokens(10)).allowed


def test_the_token_budget_counts_input_and_output_tokens() -> None:
    limiter = RateLimiter(tpm=100, regime="fixed")
    assert limiter.check(0.0, tokens(30, 30)).allowed
    assert not limiter.check(1.0, tokens(30, 30)).allowed
    assert "x-ratelimit-limit-requests" not in limiter.check(2.0, tokens(20, 20)).headers


def test_a_fixed_window_is_whole_again_exactly_at_its_boundary() -> None:
    limiter = RateLimiter(tpm=100, regime="fixed")
    assert limiter.check(59.0, tokens(100)).allowed
    assert remaining(limiter, 59.999) == {"tokens": 0}
    assert remaining(limiter, 60.0) == {"tokens": 100}
    assert limiter.views(60.0)[0].reset_s == pytest.approx(60.0)


def test_a_bucket_refills_limit_per_window_continuously() -> None:
    limiter = RateLimiter(tpm=600, regime="continuous", time_scale=2.0)
    assert limiter.check(0.0, tokens(600)).allowed
    assert remaining(limiter, 0.0) == {"tokens": 0}
    assert remaining(limiter, 6.0) == {"tokens": 60}  # 10 tokens per simulated second
    (view,) = limiter.views(6.0)
    assert view.reset_s == pytest.approx(27.0)  # 54 simulated seconds until full, at 2x
    assert remaining(limiter, 100.0) == {"tokens": 600}  # never more than the limit


def test_a_refused_request_waits_until_the_bucket_holds_its_cost() -> None:
    limiter = RateLimiter(tpm=600, regime="continuous")
    limiter.check(0.0, tokens(600))
    refused = limiter.check(6.0, tokens(100))
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(4.0)  # 40 tokens short at 10 per second
    assert not limiter.check(9.9, tokens(100)).allowed
    assert limiter.check(10.0, tokens(100)).allowed
    assert remaining(limiter, 10.0) == {"tokens": 0}


@pytest.mark.parametrize("regime", ["fixed", "continuous"])
def test_a_cost_beyond_the_whole_limit_waits_until_full(regime: Regime) -> None:
    limiter = RateLimiter(tpm=600, regime=regime)
    wait = 54.0  # the window's end, or the 600 tokens used refilled at 10 per second
    limiter.check(0.0, tokens(600))
    refused = limiter.check(6.0, tokens(700))
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(wait)
    assert not limiter.check(6.0 + wait, tokens(700)).allowed


def test_a_refused_request_is_charged_to_no_budget() -> None:
    limiter = RateLimiter(rpm=5, tpm=100, regime="continuous")
    assert not limiter.check(0.0, tokens(101)).allowed
    assert remaining(limiter, 0.0) == {"requests": 5, "tokens": 100}


def test_input_and_output_budgets_are_separate() -> None:
    limiter = RateLimiter(itpm=100, otpm=10, regime="fixed")
    refused = limiter.check(0.0, tokens(50, 20))
    assert not refused.allowed
    assert "output_tokens" in refused.message
    assert limiter.check(0.0, tokens(50, 10)).allowed
    assert remaining(limiter, 1.0) == {"input_tokens": 50, "output_tokens": 0}


def test_the_wait_is_for_every_budget_short_of_its_cost() -> None:
    limiter = RateLimiter(rpm=60, tpm=600, regime="continuous")
    limiter.check(0.0, tokens(600))
    refused = limiter.check(0.0, tokens(300))  # 30 s for the tokens, none for requests
    assert refused.retry_after_s == pytest.approx(30.0)
    assert limiter.check(30.0, tokens(300)).allowed


def test_the_tally_counts_served_refused_and_billed() -> None:
    limiter = RateLimiter(tpm=100, regime="fixed")
    limiter.check(0.0, tokens(40, 40))
    limiter.check(0.0, tokens(40, 40))
    limiter.bill(60)
    tally = limiter.tally
    assert (tally.served, tally.refused, tally.billed_tokens, tally.refused_tokens) == (
        1,
        1,
        60,
        80,
    )


def test_a_reset_zeroes_the_tally_and_fills_the_budgets_but_keeps_the_limits() -> None:
    limiter = RateLimiter(tpm=100, regime="fixed")
    limiter.check(0.0, tokens(90))
    limiter.set_limits(0.0, {"rpm": 3})
    limiter.reset()
    assert limiter.tally.served == 0
    assert remaining(limiter, 1.0) == {"requests": 3, "tokens": 100}


def test_no_budget_lets_everything_through_without_headers() -> None:
    limiter = RateLimiter(rpm=None, regime="fixed")
    verdict = limiter.check(0.0, tokens(10**9))
    assert verdict.allowed and verdict.headers == {}
    assert limiter.tally.served == 1


@pytest.mark.parametrize("regime", ["fixed", "continuous"])
def test_a_lowered_limit_keeps_what_was_used(regime: Regime) -> None:
    limiter = RateLimiter(tpm=1000, regime=regime)
    limiter.check(0.0, tokens(300))
    limiter.set_limits(0.0, {"tpm": 500})
    assert remaining(limiter, 0.0) == {"tokens": 200}
    limiter.set_limits(0.0, {"tpm": 200})
    assert remaining(limiter, 0.0) == {"tokens": 0}
    assert not limiter.check(0.0, tokens(1)).allowed
    limiter.set_limits(0.0, {"tpm": 1000})  # raised again: what was used, at most 200, stays
    assert remaining(limiter, 0.0) == {"tokens": 800}


def test_a_budget_can_be_added_and_removed_while_running() -> None:
    limiter = RateLimiter(tpm=1000, regime="continuous")
    limiter.check(0.0, tokens(300))
    limiter.set_limits(1.0, {"rpm": 2, "tpm": None})
    assert limiter.limits == {"rpm": 2, "tpm": None, "itpm": None, "otpm": None}
    assert remaining(limiter, 1.0) == {"requests": 2}


@pytest.mark.parametrize(
    "body",
    [[1], "tpm", {"tpm": 0}, {"tpm": -5}, {"tpm": True}, {"tpm": 1.5}, {"tpm": "9"}, {"x": 1}],
)
def test_bad_limits_are_refused_with_a_reason(body: object) -> None:
    with pytest.raises(ValueError, match=r"tpm|budget|object"):
        parse_limits(body)


def test_good_limits_parse_with_null_for_no_budget() -> None:
    assert parse_limits({"rpm": 3, "otpm": None}) == {"rpm": 3, "otpm": None}


@given(
    regime=st.sampled_from(["fixed", "continuous"]),
    window_s=st.floats(0.5, 120.0),
    limit=st.integers(1, 10_000),
    history=st.lists(st.tuples(st.floats(0.0, 30.0), st.integers(0, 10_000)), max_size=20),
    cost=st.integers(0, 10_000),
    time_scale=st.floats(0.5, 100.0),
)
def test_waiting_the_retry_after_is_always_enough(
    regime: Regime,
    window_s: float,
    limit: int,
    history: list[tuple[float, int]],
    cost: int,
    time_scale: float,
) -> None:
    """Invariants: a request refused with Retry-After t succeeds when retried t later (its cost
    within the limit); what remains is never below 0 or above the limit."""
    limiter = RateLimiter(
        tpm=limit,
        regime=regime,
        window_s=window_s,
        time_scale=time_scale,
    )
    now = 0.0
    for gap, spent in history:
        now += gap
        limiter.check(now, tokens(spent))
        assert 0 <= remaining(limiter, now)["tokens"] <= limit
    cost = min(cost, limit)
    verdict = limiter.check(now, tokens(cost))
    if not verdict.allowed:
        assert limiter.check(now + verdict.retry_after_s * time_scale, tokens(cost)).allowed
