"""The runtime's readiness: is its dataplane ready (`GET /ready` there)?

Shell module (one HTTP GET, its answer kept a moment; `fresh` is pure). A check asks the
dataplane with a short timeout (`CHECK_TIMEOUT_SECONDS`) and keeps the verdict for
`CACHE_SECONDS`, so an orchestrator probing often costs the dataplane one request a second at
most; checks that arrive while one is in flight wait for its verdict instead of asking again.
The dataplane's own `/ready` is open (no bearer), so none is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

CHECK_TIMEOUT_SECONDS = 1.0
CACHE_SECONDS = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """Whether the dataplane was ready when asked at `at`, and what to tell a prober if not."""

    ready: bool
    message: str
    at: float


def fresh(verdict: Verdict | None, now: float, ttl: float) -> bool:
    """True if `verdict` is recent enough to answer with."""
    return verdict is not None and 0 <= now - verdict.at < ttl


class DataplaneReadiness:
    """Asks `{dataplane}/ready`; one request per `ttl` at most."""

    def __init__(
        self,
        dataplane: str,
        *,
        timeout: float = CHECK_TIMEOUT_SECONDS,
        ttl: float = CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = dataplane.rstrip("/") + "/ready"
        self._timeout = timeout
        self._ttl = ttl
        self._clock = clock
        self._last: Verdict | None = None
        self._lock = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None

    async def check(self) -> Verdict:
        """The dataplane's readiness, asked now or at most `ttl` ago."""
        if fresh(self._last, self._clock(), self._ttl):
            assert self._last is not None
            return self._last
        async with self._lock:
            if not fresh(self._last, self._clock(), self._ttl):
                self._last = await self._ask()
            assert self._last is not None
            return self._last

    async def _ask(self) -> Verdict:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        try:
            async with asyncio.timeout(self._timeout), self._http.get(self.url) as resp:
                if resp.status == 200:
                    return Verdict(ready=True, message="ready", at=self._clock())
                why = _message(await resp.json(content_type=None), resp.status)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            why = str(exc) or type(exc).__name__
        return Verdict(
            ready=False, message=f"dataplane not ready at {self.url}: {why}", at=self._clock()
        )

    async def close(self) -> None:
        if self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.close()


def _message(body: object, status: int) -> str:
    """The error message of a JSON error body, else the status."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return f"HTTP {status}"
