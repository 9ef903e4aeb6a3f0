"""The simulator's rate-limit headers, OpenAI's and Anthropic's, read back by luftpause's own
parser (`luftpause.common.ratelimits.read`) for both families and both refill regimes."""

from __future__ import annotations

import time

import pytest
from multidict import CIMultiDict

from luftpause.common import ratelimits
from luftpause.testkit.engine.ratelimit import BUDGET_FLAGS, Cost, RateLimiter, Regime
from luftpause.testkit.engine.ratelimit_headers import (
    BudgetView,
    HeaderFamily,
    format_duration,
    format_rfc3339,
    render,
    retry_headers,
)

ALL = {"rpm": 10, "tpm": 1000, "itpm": 800, "otpm": 200}
DEC_1 = 1796150970.0  # 2026-12-01T18:49:30Z


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.02, "20ms"), (1, "1s"), (59.5, "59.5s"), (360, "6m0s"), (88.8, "1m28.8s")],
)
def test_reset_durations_use_openais_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("unix", "text"),
    [
        (DEC_1, "2026-12-01T18:49:30Z"),
        (DEC_1 + 0.25, "2026-12-01T18:49:30.250Z"),
        (DEC_1 + 0.0001, "2026-12-01T18:49:30.001Z"),  # rounded up: never early
    ],
)
def test_anthropic_resets_are_rfc3339_utc(unix: float, text: str) -> None:
    assert format_rfc3339(unix) == text


def test_openai_headers_carry_requests_and_tokens_only() -> None:
    views = [
        BudgetView(name="tokens", limit=100, remaining=40, reset_s=1.5),
        BudgetView(name="input_tokens", limit=80, remaining=0, reset_s=2.0),
    ]
    assert render("openai", views, DEC_1) == {
        "x-ratelimit-limit-tokens": "100",
        "x-ratelimit-remaining-tokens": "40",
        "x-ratelimit-reset-tokens": "1.5s",
    }


def test_a_provider_that_reports_no_budgets_sends_no_headers_but_a_refusals_wait() -> None:
    views = [BudgetView(name="requests", limit=1, remaining=0, reset_s=3.0)]
    assert render("none", views, DEC_1) == {}
    assert retry_headers(3.0)["Retry-After"] == "3"


def test_anthropic_headers_name_every_budget_and_reset_at_a_time() -> None:
    views = [BudgetView(name="output_tokens", limit=80, remaining=5, reset_s=2.0)]
    assert render("anthropic", views, DEC_1) == {
        "anthropic-ratelimit-output-tokens-limit": "80",
        "anthropic-ratelimit-output-tokens-remaining": "5",
        "anthropic-ratelimit-output-tokens-reset": "2026-12-01T18:49:32Z",
    }


@pytest.mark.parametrize(("wait", "after", "ms"), [(0.2, "1", "200"), (2.5, "3", "2500")])
def test_a_refusal_says_when_to_retry_in_seconds_and_milliseconds(
    wait: float, after: str, ms: str
) -> None:
    assert retry_headers(wait) == {"Retry-After": after, "retry-after-ms": ms}


@pytest.mark.parametrize("family", ["openai", "anthropic"])
@pytest.mark.parametrize("regime", ["fixed", "continuous"])
def test_luftpauses_parser_reads_what_the_simulator_sends(
    family: HeaderFamily, regime: Regime
) -> None:
    limiter = RateLimiter(**ALL, regime=regime, time_scale=2.0, headers=family)
    wall = time.time()
    ok = limiter.check(10.0, Cost(input_tokens=300, output_tokens=100), wall_s=wall)
    refused = limiter.check(10.0, Cost(input_tokens=100, output_tokens=150), wall_s=wall)
    assert ok.allowed and not refused.allowed
    # Real seconds (2x) until full: a bucket refills what was used at limit per 60 s; a fixed
    # window ends 50 simulated seconds later.
    full = {"requests": 3.0, "tokens": 12.0, "input_tokens": 11.25, "output_tokens": 15.0}
    reading = ratelimits.read(CIMultiDict(ok.headers), wall)
    assert reading is not None and reading.malformed == ()
    names = ("requests", "tokens") if family == "openai" else ratelimits.BUDGETS
    assert set(reading.budgets) == set(names)
    expected = {"requests": 9, "tokens": 600, "input_tokens": 500, "output_tokens": 100}
    for flag, name in BUDGET_FLAGS.items():
        if name in names:
            reset = full[name] if regime == "continuous" else 25.0
            budget = reading.budgets[name]
            assert (budget.limit, budget.remaining) == (ALL[flag], expected[name])
            assert budget.reset_s == pytest.approx(reset, abs=1e-3)
    headers = CIMultiDict({**refused.headers, **retry_headers(refused.retry_after_s)})
    back = ratelimits.read(headers, wall)
    assert back is not None and back.malformed == ()
    assert back.retry_after_s is not None and back.retry_after_s >= refused.retry_after_s
