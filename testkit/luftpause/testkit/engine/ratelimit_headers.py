"""The rate-limit headers a hosted API sends, in OpenAI's or Anthropic's family.

Pure module: a budget's view (limit, remaining, real seconds until it is full again) in,
header names and values out; the caller passes the wall clock (Unix seconds) that Anthropic's
RFC 3339 resets are written against. What `luftpause.common.ratelimits.read` parses:

- openai (and Groq): `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as
  durations (`450ms`, `1.5s`, `6m0s`); OpenAI has no input or output budgets, so those are
  enforced but not reported;
- anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
  remaining,reset}`, resets as RFC 3339 UTC times (`2026-12-01T18:49:30Z`, milliseconds when
  not whole);
- none: no budget headers at all (a provider, or a gateway, that says nothing of its limits
  until it refuses);
- all, on a 429: `Retry-After` (whole seconds, rounded up, at least 1) and `retry-after-ms`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

HeaderFamily = Literal["openai", "anthropic", "none"]
HEADER_FAMILIES: tuple[HeaderFamily, ...] = ("openai", "anthropic", "none")
_OPENAI_BUDGETS = ("requests", "tokens")


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetView:
    """One budget as a reply reports it; `reset_s` is real seconds."""

    name: str  # requests, tokens, input_tokens or output_tokens
    limit: int
    remaining: int
    reset_s: float


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: '20ms', '1s', '59.5s', '6m0s', '1h2m3s'."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole_minutes, rest = divmod(seconds, 60)
    secs = f"{round(rest, 3):g}s"
    hours, minutes = divmod(int(whole_minutes), 60)
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


def format_rfc3339(unix_s: float) -> str:
    """A UTC time as Anthropic writes it; milliseconds (rounded up) only when not whole."""
    millis = math.ceil(round(unix_s * 1000, 6))
    when = datetime.fromtimestamp(millis // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{when}.{millis % 1000:03d}Z" if millis % 1000 else f"{when}Z"


def render(family: HeaderFamily, views: Iterable[BudgetView], wall_s: float) -> dict[str, str]:
    """The headers for these budgets; `wall_s` is now, in Unix seconds."""
    headers: dict[str, str] = {}
    if family == "none":
        return headers
    for view in views:
        if family == "openai":
            if view.name in _OPENAI_BUDGETS:
                headers[f"x-ratelimit-limit-{view.name}"] = str(view.limit)
                headers[f"x-ratelimit-remaining-{view.name}"] = str(view.remaining)
                headers[f"x-ratelimit-reset-{view.name}"] = format_duration(view.reset_s)
        else:
            prefix = f"anthropic-ratelimit-{view.name.replace('_', '-')}"
            headers[f"{prefix}-limit"] = str(view.limit)
            headers[f"{prefix}-remaining"] = str(view.remaining)
            headers[f"{prefix}-reset"] = format_rfc3339(wall_s + view.reset_s)
    return headers


def retry_headers(retry_after_s: float) -> dict[str, str]:
    """A 429's wait, in real seconds, as both families write it (never shorter than the wait)."""
    return {
        "Retry-After": str(max(1, math.ceil(retry_after_s))),
        "retry-after-ms": str(max(0, math.ceil(round(retry_after_s * 1000, 6)))),
    }
