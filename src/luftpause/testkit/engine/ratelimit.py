"""Hosted-API rate limits: requests and tokens per fixed window, OpenAI's headers.

Pure module: the caller passes the simulated time. Budgets count per window of
`window_s` simulated seconds (60 by default); a request costs one request and its prompt plus
`max_tokens` tokens, as OpenAI estimates it. Durations in headers are real time (simulated
time divided by the time scale), because the client waits in real time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    allowed: bool
    headers: dict[str, str] = field(default_factory=dict)
    retry_after_s: float = 0.0
    message: str = ""


class RateLimiter:
    """Fixed-window request and token budgets."""

    def __init__(
        self, *, rpm: int | None, tpm: int | None, window_s: float = 60.0, time_scale: float = 1.0
    ) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self.window_s = window_s
        self.time_scale = time_scale
        self.reset()

    def reset(self) -> None:
        self._window = -1
        self._requests = 0
        self._tokens = 0
        self.limited_total = 0

    def check(self, now_s: float, tokens: int) -> Verdict:
        """Charge a request of `tokens` tokens at simulated time `now_s`, or refuse it."""
        window = math.floor(now_s / self.window_s)
        if window != self._window:
            self._window, self._requests, self._tokens = window, 0, 0
        reset_s = ((window + 1) * self.window_s - now_s) / self.time_scale
        over_requests = self.rpm is not None and self._requests + 1 > self.rpm
        over_tokens = self.tpm is not None and self._tokens + tokens > self.tpm
        if over_requests or over_tokens:
            self.limited_total += 1
            what = "requests" if over_requests else "tokens"
            limit = self.rpm if over_requests else self.tpm
            return Verdict(
                allowed=False,
                headers=self._headers(reset_s),
                retry_after_s=reset_s,
                message=f"Rate limit reached for {what} per window: limit {limit}. "
                f"Please try again in {format_duration(reset_s)}.",
            )
        self._requests += 1
        self._tokens += tokens
        return Verdict(allowed=True, headers=self._headers(reset_s))

    def _headers(self, reset_s: float) -> dict[str, str]:
        headers: dict[str, str] = {}
        reset = format_duration(reset_s)
        for what, limit, used in (
            ("requests", self.rpm, self._requests),
            ("tokens", self.tpm, self._tokens),
        ):
            if limit is not None:
                headers[f"x-ratelimit-limit-{what}"] = str(limit)
                headers[f"x-ratelimit-remaining-{what}"] = str(max(0, limit - used))
                headers[f"x-ratelimit-reset-{what}"] = reset
        return headers
