"""What a hosted API's reply says about its rate limits: the budget left and when it refills.

Pure module: headers in, a `Reading` out; the caller passes the wall clock (`now`, Unix
seconds) that RFC 3339 resets are measured against. Three families are read:

- OpenAI and Groq: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as
  durations (`6m0s`, `1.5s`, `450ms`, `1h2m3s`, or plain seconds);
- Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,
  reset}`, resets as RFC 3339 times;
- `Retry-After` (on 429 and 503): seconds, or an HTTP date.

A header that is present but cannot be read is named in `Reading.malformed` and otherwise left
out: a provider's odd header is a counted event, never an error. A reply with none of these
headers has no reading (`read` returns None).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime

BUDGETS = ("requests", "tokens", "input_tokens", "output_tokens")

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?")
_MILLIS = re.compile(r"(\d+(?:\.\d+)?)ms")
# Any of these present: the reply may carry a reading (a cheap test before reading them all).
_MARKERS = (
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-output-tokens-remaining",
    "retry-after",
)


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget (requests, tokens, ...): its limit, what remains, seconds until it refills."""

    limit: int | None = None
    remaining: int | None = None
    reset_s: float | None = None


_NO_BUDGET = Budget()


@dataclass(frozen=True, slots=True)
class Reading:
    """The budgets one reply reported, by name (`BUDGETS`), and its Retry-After."""

    budgets: dict[str, Budget] = field(default_factory=dict)
    retry_after_s: float | None = None
    malformed: tuple[str, ...] = ()


def parse_duration(text: str) -> float | None:
    """Seconds in an OpenAI-style duration (`6m0s`, `1.5s`, `450ms`, `1h2m3s`, `20`)."""
    text = text.strip().lower()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) and value >= 0 else None
    millis = _MILLIS.fullmatch(text)
    if millis:
        return float(millis.group(1)) / 1000
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        return None
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def parse_retry_after(text: str, now: float) -> float | None:
    """Seconds to wait from a Retry-After value: delta seconds, or an HTTP date."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) and value >= 0 else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - now, 0.0)


def parse_rfc3339(text: str, now: float) -> float | None:
    """Seconds from `now` until an RFC 3339 time (0 if it is past)."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - now, 0.0)


def read(
    headers: Mapping[str, str], now: float, names: Mapping[str, str] | None = None
) -> Reading | None:
    """The rate-limit reading in a reply's headers (case-insensitive mapping), if any.

    `names` renames headers for a provider that calls them otherwise: the standard name (as
    above, lower case) -> the provider's name for it (endpoint `limits.headers`)."""
    if names:
        headers = renamed(headers, names)
    if not any(name in headers for name in _MARKERS):
        return None
    malformed: list[str] = []
    budgets: dict[str, Budget] = {}
    for name in ("requests", "tokens"):
        budget = _budget(
            headers,
            malformed,
            limit=f"x-ratelimit-limit-{name}",
            remaining=f"x-ratelimit-remaining-{name}",
            reset=(f"x-ratelimit-reset-{name}", parse_duration),
        )
        if budget is not None:
            budgets[name] = budget
    for name in BUDGETS:
        prefix = f"anthropic-ratelimit-{name.replace('_', '-')}"
        budget = _budget(
            headers,
            malformed,
            limit=f"{prefix}-limit",
            remaining=f"{prefix}-remaining",
            reset=(f"{prefix}-reset", lambda text: parse_rfc3339(text, now)),
        )
        if budget is not None:
            budgets[name] = budget  # a provider speaks one family; Anthropic's wins if both
    retry_after = None
    raw = headers.get("retry-after")
    if raw is not None:
        retry_after = parse_retry_after(raw, now)
        if retry_after is None:
            malformed.append("retry-after")
    if not budgets and retry_after is None and not malformed:
        return None
    return Reading(budgets=budgets, retry_after_s=retry_after, malformed=tuple(malformed))


def renamed(headers: Mapping[str, str], names: Mapping[str, str]) -> dict[str, str]:
    """`headers` (lower-cased) with each provider's name in `names` read as the standard one."""
    plain = {k.lower(): v for k, v in headers.items()}
    for standard, theirs in names.items():
        value = plain.get(theirs)
        if value is not None:
            plain[standard] = value
    return plain


def _budget(
    headers: Mapping[str, str],
    malformed: list[str],
    *,
    limit: str,
    remaining: str,
    reset: tuple[str, Callable[[str], float | None]],
) -> Budget | None:
    reset_name, parse = reset
    budget = Budget(
        limit=_count(headers, limit, malformed),
        remaining=_count(headers, remaining, malformed),
        reset_s=_parsed(headers, reset_name, parse, malformed),
    )
    return None if budget == _NO_BUDGET else budget


def _count(headers: Mapping[str, str], name: str, malformed: list[str]) -> int | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        malformed.append(name)
        return None
    return value


def _parsed(
    headers: Mapping[str, str],
    name: str,
    parse: Callable[[str], float | None],
    malformed: list[str],
) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    value = parse(raw)
    if value is None:
        malformed.append(name)
    return value
