"""The planner: what runs cost and what they will, for the runtime and its tools. It prices a
run at spawn, tells what a run spent, answers the `forecast` tool and sees a seconds budget's
overrun one turn ahead.

Shell module: it holds the runtime's prices (the prices file, `load_prices`), the ledger it
learns from its journal (`observed_journal`, `turn_samples`) and the scheduler's rate-limit
windows (`scheduler_status`). The decisions are the pure core's: `price_table` (prices, spawn's
check, spend), `forecast_view` (a run's inputs and the tool's answer), `forecast` (the
projection) and `lookahead` (the seconds budget's look one turn ahead).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from luftpause.common.files import load_structured
from luftpause.runtime.core import forecast_view, lookahead, price_table
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.budget import HasState
from luftpause.runtime.core.errors import RequestError
from luftpause.runtime.core.forecast import project
from luftpause.runtime.core.price_table import PricesError, PriceTable, parse_prices
from luftpause.runtime.core.rate_waits import Window, windows_for
from luftpause.runtime.core.turn_samples import Ledger
from luftpause.runtime.journal.file import Store
from luftpause.runtime.plans.observed_journal import ObservedJournal
from luftpause.runtime.plans.scheduler_status import SchedulerStatus

NO_SCHEDULER = "no scheduler status (--scheduler-url): rate-limit waits are counted as 0"
NO_WINDOW = "no rate-limit window of the scheduler counts its turns: no waits"

# A model's context window in tokens, as the runtime knows it (None: unknown).
ContextWindows = Callable[[str], Awaitable[int | None]]


def load_prices(path: str | Path) -> PriceTable:
    """Read and check a YAML or TOML prices file (`price_table`)."""
    p = Path(path)
    raw = load_structured(p, "prices file", PricesError)
    try:
        return parse_prices(raw)
    except PricesError as exc:
        raise PricesError(f"{p}: {exc}") from None


class Planner:
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
        return price_table.priced(spec, runs, self.prices)

    def overrun(
        self, runs: Mapping[str, HasState], handle: str, now: float
    ) -> tuple[str, m.Exceeded] | None:
        """A seconds budget the run's next turn would overrun (`lookahead.overrun`)."""
        return lookahead.overrun(runs, handle, self.ledger, now)

    def spend(self, runs: Mapping[str, HasState], handle: str, now: float) -> dict[str, Any]:
        return price_table.spend(runs, handle, now)

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
            return forecast_view.view(runs, handle, now, None)
        windows, notes = await self._windows(state.spec)
        context = await self._context_window(state.spec.model)
        given = forecast_view.inputs(
            runs, handle, self.ledger, now, steps=steps, context_window=context, windows=windows
        )
        return forecast_view.view(runs, handle, now, project(given), notes)

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
        "or TOML by extension): runs then show their cost, spawn takes budgetUsd",
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
