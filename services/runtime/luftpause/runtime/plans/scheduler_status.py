"""The scheduler's `GET /status`, read for its rate-limit windows (`rate_waits`): at most once
a second, and once every `STATUS_RETRY_AFTER` seconds while the scheduler cannot be reached.

Shell module (one HTTP GET through aiohttp, its answer kept a moment); `--scheduler-url` names
the scheduler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import structlog

STATUS_TIMEOUT = 1.0
STATUS_MAX_AGE = 1.0
# After a failed read: status calls must not each wait for an unreachable scheduler.
STATUS_RETRY_AFTER = 10.0

log = structlog.get_logger(service="runtime")


class SchedulerStatus:
    """The scheduler's `/status`, fetched at most once per `STATUS_MAX_AGE` seconds (once per
    `STATUS_RETRY_AFTER` while it fails)."""

    def __init__(self, url: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url.rstrip("/") + "/status"
        self._clock = clock
        self._http: aiohttp.ClientSession | None = None
        self._doc: Mapping[str, Any] | None = None
        self._note: str | None = None
        self._due = -1.0e9
        self._lock = asyncio.Lock()

    async def read(self) -> tuple[Mapping[str, Any] | None, str | None]:
        """The status document (None if unreachable) and a note saying why it is missing."""
        async with self._lock:
            if self._clock() >= self._due:
                self._doc, self._note = await self._fetch()
                wait = STATUS_MAX_AGE if self._doc is not None else STATUS_RETRY_AFTER
                self._due = self._clock() + wait
            return self._doc, self._note

    async def _fetch(self) -> tuple[Mapping[str, Any] | None, str | None]:
        if self._http is None:
            timeout = aiohttp.ClientTimeout(total=STATUS_TIMEOUT)
            self._http = aiohttp.ClientSession(timeout=timeout)
        try:
            async with self._http.get(self.url) as resp:
                doc = await resp.json(content_type=None)
                if resp.status != 200 or not isinstance(doc, dict):
                    raise ValueError(f"status {resp.status}")
                return doc, None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("forecast.scheduler_status_failed", url=self.url, error=repr(exc))
            return None, f"scheduler status unreachable at {self.url} ({exc!r}): waits are 0"

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
