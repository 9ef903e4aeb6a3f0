"""An endpoint's rate limits as its endpoint file states them (`limits:`).

Pure module: values and parsing, no I/O. A hosted endpoint's limits are learned from the
rate-limit headers of its replies (`common.ratelimits`); the file may also state them, for a
provider that sends no headers, or to be safe before the first reply::

    endpoints:
      - id: openai
        url: https://api.openai.com
        models: [gpt-4.1-mini]
        api_key_env: OPENAI_API_KEY
        limits:
          tpm: 200000          # tokens per minute
          rpm: 500             # requests per minute
          itpm: 0              # input tokens per minute (Anthropic); 0: none stated
          otpm: 0              # output tokens per minute (Anthropic)
          share: org-key       # endpoints behind one API key share one window
          charges: max_tokens  # the provider counts a request's max_tokens up front (OpenAI's,
                               # Anthropic's rule); usage: only what the reply used
          window_s: 60         # the stated limits count over this many seconds (a minute)
          headers:             # header names of a provider that renames them
            x-ratelimit-remaining-tokens: x-remaining-tokens

An endpoint with `limits:` (even an empty mapping) is rate-limited from the start: its turns are
admitted by its budget, never placed by a dataplane on its own. Any other endpoint becomes so
when a reply first carries rate-limit headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CHARGES = ("usage", "max_tokens")
_COUNTS = ("tpm", "rpm", "itpm", "otpm")


class LimitsError(ValueError):
    """The `limits` mapping of an endpoint is malformed (the message says how)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Stated limits per minute (0: not stated), the shared window, and header renames."""

    tpm: int = 0
    rpm: int = 0
    itpm: int = 0
    otpm: int = 0
    share: str = ""
    charges: str = "max_tokens"
    # The seconds the stated limits count over (their names say per minute: the default).
    window_s: float = 60.0
    # Canonical header name (as `common.ratelimits` reads it) -> the provider's name for it.
    headers: Mapping[str, str] = field(default_factory=dict)

    def per_minute(self) -> dict[str, int]:
        """The stated budgets by `common.ratelimits.BUDGETS` name (only those stated)."""
        named = {
            "tokens": self.tpm,
            "requests": self.rpm,
            "input_tokens": self.itpm,
            "output_tokens": self.otpm,
        }
        return {name: value for name, value in named.items() if value}


def parse_limits(value: Any, where: str) -> Limits | None:
    """The `limits` of one endpoint (None when absent); `LimitsError` on a bad one."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise LimitsError(f"{where} must be a mapping (tpm, rpm, itpm, otpm, share, ...)")
    unknown = set(value) - {*_COUNTS, "share", "charges", "headers", "window_s"}
    if unknown:
        raise LimitsError(f"{where}: unknown keys {sorted(unknown)}")
    counts: dict[str, int] = {}
    for name in _COUNTS:
        raw = value.get(name, 0)
        if not isinstance(raw, int) or isinstance(raw, bool) or raw < 0:
            raise LimitsError(f"{where}.{name} must be a whole number >= 0, got {raw!r}")
        counts[name] = raw
    share = value.get("share", "")
    if not isinstance(share, str):
        raise LimitsError(f"{where}.share must be a string")
    charges = value.get("charges", "max_tokens")
    if charges not in CHARGES:
        raise LimitsError(f"{where}.charges must be one of {', '.join(CHARGES)}, got {charges!r}")
    window = value.get("window_s", 60.0)
    if isinstance(window, bool) or not isinstance(window, int | float) or not 0 < window <= 86400:
        raise LimitsError(f"{where}.window_s must be seconds in (0, 86400], got {window!r}")
    headers = value.get("headers", {})
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in headers.items()
    ):
        raise LimitsError(f"{where}.headers must map header names to header names")
    return Limits(
        **counts,
        share=share.strip(),
        charges=charges,
        window_s=float(window),
        headers={k.lower(): v.lower() for k, v in headers.items()},
    )
