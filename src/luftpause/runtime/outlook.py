"""What runs cost and what they will: the runtime's prices, the ledger it learns from its
journal, the scheduler's rate-limit windows, and the `forecast` they make.

Shell module: reads the scheduler's `GET /status` over HTTP (at most once a second, `--scheduler
-url`), wraps the journal file so that the ledger (`learned`) learns from every record read back
on start and every record appended (and the spend metric counts each appended turn's USD). The
decisions are the pure modules': `money` (prices, spawn's check, spend), `foresee` (inputs, the
seconds budget that looks ahead, the answer) and `forecast` (the projection).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
import structlog

from luftpause.runtime import foresee, money
from luftpause.runtime import machine as m
from luftpause.runtime.budget import HasState
from luftpause.runtime.errors import RequestError
from luftpause.runtime.forecast import project
from luftpause.runtime.learned import Ledger
from luftpause.runtime.money import PriceTable
from luftpause.runtime.store import Store
from luftpause.runtime.waits import Window, windows_for

STATUS_TIMEOUT = 1.0
STATUS_MAX_AGE = 1.0
# After a failed read: status calls must not each wait for an unreachable scheduler.
STATUS_RETRY_AFTER = 10.0
NO_SCHEDULER = "no scheduler status (--scheduler-url): rate-limit waits are counted as 0"
NO_WINDOW = "no rate-limit window of the scheduler counts its turns: no waits"

# A model's context window in tokens, as the runtime knows it (None: unknown).
ContextWindows = Callable[[str], Awaitable[int | None]]

log = structlog.get_logger(service="runtime")


class ObservedJournal:
    """A journal whose records the ledger learns from: read back on `open`, appended (each
    appended turn's cost then goes to `spent`), and written by another replica (`learn`).
    Everything else is the inner journal's."""

    def __init__(self, inner: Store, ledger: Ledger, spent: Callable[[str, float], None]) -> None:
        self.path = getattr(inner, "path", None)  # the file's, for a file journal
        self.inner = inner
        self._inner = inner
        self._ledger = ledger
        self._spent = spent

    def open(self) -> list[dict[str, Any]]:
        records = self._inner.open()
        for record in records:
            self._ledger.feed(record)
        return records

    async def append(self, record: dict[str, Any], *, retry: bool = True) -> None:
        # Learned before the write: the run's state already holds the record's step, and a
        # forecast during the write must see both alike. A record not written (`retry` false)
        # begins no run, so what was learned of it stays unused.
        spent = self._ledger.feed(record)
        await self._inner.append(record, retry=retry)
        for s in spent:
            self._spent(s.model, s.usd)

    def learn(self, record: dict[str, Any]) -> None:
        """A record another replica wrote."""
        self._ledger.feed(record)

    @property
    def failing(self) -> str | None:
        return self._inner.failing

    async def committed(self, handles: Iterable[str] | None = None) -> list[dict[str, Any]]:
        return await self._inner.committed(handles)

    async def archive(self, handles: set[str]) -> int:
        return await self._inner.archive(handles)

    def close(self) -> None:
        self._inner.close()


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


class Outlook:
    """Prices, the ledger and the scheduler's windows, for the runtime and its tools.

    A model's context window comes from `context_windows` (the runtime's own knowledge, e.g.
    the context wall's), else from the prices file's `context_window`.
    """

    def __init__(
        self,
        *,
        prices: PriceTable | None = None,
        scheduler_url: str | None = None,
        ledger: Ledger | None = None,
        context_windows: ContextWindows | None = None,
    ) -> None:
        self.prices = prices
        self.context_windows = context_windows
        self.ledger = Ledger() if ledger is None else ledger
        self.scheduler = None if scheduler_url is None else SchedulerStatus(scheduler_url)

    def observed(self, journal_file: Store, spent: Callable[[str, float], None]) -> ObservedJournal:
        """`journal_file`, its records learned from (see `ObservedJournal`)."""
        return ObservedJournal(journal_file, self.ledger, spent)

    def priced(self, spec: m.RunSpec, runs: Mapping[str, HasState]) -> m.RunSpec:
        """The spec with its model's price; `RequestError` if a USD budget covers it unpriced."""
        return money.priced(spec, runs, self.prices)

    def overrun(
        self, runs: Mapping[str, HasState], handle: str, now: float
    ) -> tuple[str, m.Exceeded] | None:
        """A seconds budget the run's next turn would overrun (`foresee.overrun`)."""
        return foresee.overrun(runs, handle, self.ledger, now)

    def spend(self, runs: Mapping[str, HasState], handle: str, now: float) -> dict[str, Any]:
        return money.spend(runs, handle, now)

    async def forecast(
        self, runs: Mapping[str, HasState], handle: str, steps: int | None, now: float
    ) -> dict[str, Any]:
        """The `forecast` tool's answer; `RequestError` for an unknown run or steps below 1."""
        if handle not in runs:
            raise RequestError(f"no run {handle}")
        if steps is not None and steps < 1:
            raise RequestError(f"steps must be at least 1, got {steps}")
        state = runs[handle].state
        if state.phase.over:
            return foresee.view(runs, handle, now, None)
        windows, notes = await self._windows(state.spec)
        context = await self._context_window(state.spec.model)
        given = foresee.inputs(
            runs, handle, self.ledger, now, steps=steps, context_window=context, windows=windows
        )
        return foresee.view(runs, handle, now, project(given), notes)

    async def add_forecasts(
        self, runs: Mapping[str, HasState], summaries: list[dict[str, Any]], now: float
    ) -> None:
        """A `forecast` in each summary of a live run (status)."""
        for summary in summaries:
            handle = summary.get("handle")
            if isinstance(handle, str) and handle in runs and not runs[handle].state.phase.over:
                summary["forecast"] = await self.forecast(runs, handle, None, now)

    async def _context_window(self, model: str) -> int | None:
        known = None if self.context_windows is None else await self.context_windows(model)
        if known is None and self.prices is not None:
            known = self.prices.context_window(model)
        return known

    async def _windows(self, spec: m.RunSpec) -> tuple[list[Window], list[str]]:
        if self.scheduler is None:
            return [], [NO_SCHEDULER]
        doc, note = await self.scheduler.read()
        if doc is None:
            return [], [] if note is None else [note]
        windows = windows_for(doc, spec.model, spec.key)
        return windows, [] if windows else [NO_WINDOW]

    async def close(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.close()


# --- the command line ---


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`luftpause runtime`'s flags for prices and forecasts."""
    p.add_argument(
        "--prices",
        metavar="PATH",
        help="prices per model, USD per million input, cached input and output tokens (YAML, "
        "or TOML by extension; see `money`): runs then show their cost, spawn takes budgetUsd",
    )
    p.add_argument(
        "--scheduler-url",
        metavar="URL",
        help="the scheduler's HTTP base URL (http://host:5001): forecasts read the rate-limit "
        "budgets of its /status for the waits ahead (without it, waits are counted as 0)",
    )


def check_url(url: str) -> None:
    """`ValueError` unless `url` is an http(s) URL."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--scheduler-url: not an http(s) URL: {url!r}")
