"""Reading a hosted API's rate-limit headers: OpenAI/Groq, Anthropic, Retry-After, and junk."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from multidict import CIMultiDict

from luftpause.common.ratelimits import Budget, parse_duration, read
from luftpause.testkit.engine.ratelimit import RateLimiter, format_duration

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("1.5s", 1.5),
        ("450ms", 0.45),
        ("1h2m3s", 3723.0),
        ("2m30.5s", 150.5),
        ("1m", 60.0),
        ("0s", 0.0),
        ("20", 20.0),
        (" 7s ", 7.0),
    ],
)
def test_durations_in_openais_format(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5x", "-3", "1.5.2s", "ms", "nan", "inf", "m5s"])
def test_durations_that_are_not(text: str) -> None:
    assert parse_duration(text) is None


@pytest.mark.parametrize("seconds", [0.02, 0.999, 1.0, 59.5, 360.0, 3723.25])
def test_what_the_test_kits_hosted_mode_writes_reads_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=0.001)


def test_the_test_kits_limiter_headers_give_a_reading() -> None:
    limiter = RateLimiter(rpm=10, tpm=1000, window_s=60.0)
    verdict = limiter.check(now_s=15.0, tokens=300)
    reading = read(CIMultiDict(verdict.headers), NOW)
    assert reading is not None and not reading.malformed
    assert reading.budgets["requests"] == Budget(limit=10, remaining=9, reset_s=45.0)
    assert reading.budgets["tokens"] == Budget(limit=1000, remaining=700, reset_s=45.0)


def test_openai_headers_any_case() -> None:
    headers = CIMultiDict(
        {
            "X-RateLimit-Limit-Requests": "500",
            "X-RateLimit-Remaining-Requests": "499",
            "X-RateLimit-Reset-Requests": "120ms",
            "X-RateLimit-Limit-Tokens": "30000",
            "X-RateLimit-Remaining-Tokens": "29000",
            "X-RateLimit-Reset-Tokens": "2s",
        }
    )
    reading = read(headers, NOW)
    assert reading is not None
    assert reading.budgets == {
        "requests": Budget(limit=500, remaining=499, reset_s=0.12),
        "tokens": Budget(limit=30000, remaining=29000, reset_s=2.0),
    }
    assert reading.retry_after_s is None and reading.malformed == ()


def test_anthropic_headers_with_separate_input_and_output_budgets() -> None:
    reset = datetime.fromtimestamp(NOW + 30, tz=UTC).isoformat().replace("+00:00", "Z")
    past = datetime.fromtimestamp(NOW - 5, tz=UTC).isoformat()
    headers = CIMultiDict(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": reset,
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "39000",
            "anthropic-ratelimit-input-tokens-reset": reset,
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "7990",
            "anthropic-ratelimit-output-tokens-reset": past,
        }
    )
    reading = read(headers, NOW)
    assert reading is not None and reading.malformed == ()
    assert reading.budgets["requests"] == Budget(limit=50, remaining=49, reset_s=30.0)
    assert reading.budgets["input_tokens"] == Budget(limit=40000, remaining=39000, reset_s=30.0)
    assert reading.budgets["output_tokens"] == Budget(limit=8000, remaining=7990, reset_s=0.0)
    assert "tokens" not in reading.budgets


def test_retry_after_as_seconds_or_as_a_date() -> None:
    seconds = read(CIMultiDict({"Retry-After": "7"}), NOW)
    assert seconds is not None and seconds.retry_after_s == 7.0 and seconds.budgets == {}
    when = format_datetime(datetime.fromtimestamp(NOW, tz=UTC) + timedelta(seconds=90), True)
    dated = read(CIMultiDict({"Retry-After": when}), NOW)
    assert dated is not None and dated.retry_after_s == pytest.approx(90.0)


def test_a_reply_without_rate_limit_headers_has_no_reading() -> None:
    assert read(CIMultiDict({"Content-Type": "application/json"}), NOW) is None


def test_malformed_headers_are_named_and_left_out_never_raised() -> None:
    headers = CIMultiDict(
        {
            "x-ratelimit-limit-tokens": "lots",
            "x-ratelimit-remaining-tokens": "-4",
            "x-ratelimit-reset-tokens": "whenever",
            "x-ratelimit-remaining-requests": "12",
            "anthropic-ratelimit-requests-reset": "tomorrow",
            "retry-after": "Mon, 99 Foo 2026",
        }
    )
    reading = read(headers, NOW)
    assert reading is not None
    assert set(reading.malformed) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-requests-reset",
        "retry-after",
    }
    assert reading.budgets == {"requests": Budget(remaining=12)}
    assert reading.retry_after_s is None


def test_a_provider_that_renames_the_headers_is_read_by_its_own_names() -> None:
    names = {"x-ratelimit-remaining-tokens": "x-remaining-tokens"}
    headers = {"X-Remaining-Tokens": "42", "x-ratelimit-limit-tokens": "100"}
    reading = read(CIMultiDict(headers), 0.0, names)
    assert reading is not None and reading.budgets["tokens"].remaining == 42
    assert read(CIMultiDict({"X-Remaining-Tokens": "42"}), 0.0) is None
