"""The budgets of the runs driven here, tripped when they are past a limit.

Shell module (asyncio timers). What is past is the core's (`budget.check`, over the subtree's
use); this module checks after every turn and tool round anywhere below a budgeted run, on every
spawn into its subtree, and by one timer per seconds budget (at spawn + budgetSeconds, so an idle
subtree trips too). Before a turn, a run stops if its seconds budget would not see the turn
finish (`planner.overrun`, the core's `lookahead`). A trip is journaled as the budgeted run's
`BudgetExceeded` step, counted, and then its subtree is cancelled with the reason, in the
background: the run that tripped it may be in that subtree.

On a shared journal a budget is tripped by the replica that drives the run over its limit, which
sees its subtree's spend through the views of the others' runs (`Driven.here`). The guard knows
the runtime only through the callbacks it is built with: step and journal a run (`Apply`),
cancel a subtree (`Cancel`), run a coroutine in the background (`Background`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Generic, Protocol, TypeVar

import structlog

from luftpause.runtime.core import budget
from luftpause.runtime.core import machine as m
from luftpause.runtime.plans.planner import Planner
from luftpause.runtime.server.metrics import RuntimeMetrics

# Past the deadline, so the subtree's seconds are over the limit, not at it.
TIMER_SLACK = 0.05

log = structlog.get_logger(service="runtime")


class Driven(Protocol):
    """A run as the guard sees it: its state, and whether this replica drives it."""

    @property
    def state(self) -> m.RunState: ...

    @property
    def here(self) -> bool: ...


R = TypeVar("R", bound=Driven)
Apply = Callable[[R, m.Event], Awaitable[None]]  # step the run's state and journal the step
Cancel = Callable[[str, str], Coroutine[Any, Any, Any]]  # cancel a run's subtree, with a reason
Background = Callable[[Coroutine[Any, Any, Any]], None]  # run it, owned by the runtime


class BudgetGuard(Generic[R]):
    """Every budget of the runs driven here; one per runtime."""

    def __init__(
        self,
        runs: Mapping[str, R],
        *,
        apply: Apply[R],
        cancel: Cancel,
        background: Background,
        planner: Planner,
        metrics: RuntimeMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._runs = runs
        self._apply = apply
        self._cancel = cancel
        self._background = background
        self._planner = planner
        self._metrics = metrics
        self._clock = clock
        self._timers: dict[str, asyncio.Task[None]] = {}

    def start_timer(self, run: R) -> None:
        """The timer of the run's seconds budget, if it has one not yet tripped."""
        spec = run.state.spec
        if spec.budget_seconds is not None and run.state.exceeded is None:
            task = asyncio.create_task(self._timer(spec), name=f"budget timer {spec.handle}")
            self._timers[spec.handle] = task
            task.add_done_callback(lambda _: self._timers.pop(spec.handle, None))

    def stop_timer(self, handle: str) -> None:
        timer = self._timers.pop(handle, None)
        if timer is not None:
            timer.cancel()

    def timers(self) -> list[asyncio.Task[None]]:
        """The timers running, for a stop to cancel."""
        return list(self._timers.values())

    async def _timer(self, spec: m.RunSpec) -> None:
        deadline = budget.deadline(spec)
        assert deadline is not None
        await asyncio.sleep(max(0.0, deadline - self._clock()) + TIMER_SLACK)
        await self.check(spec.handle)

    async def check(self, handle: str) -> None:
        """Trip every budget at or above `handle` that is past a limit (of runs driven here)."""
        for h, exceeded in budget.check(self._runs, handle, self._clock()):
            if not self._runs[h].here:
                continue  # its own replica trips it, seeing the same spend
            await self._apply(self._runs[h], m.BudgetExceeded(exceeded=exceeded))
            self._tripped(h, exceeded)

    def cancel_exceeded(self, runs: Mapping[str, R]) -> None:
        """Finish cancelling what still lives under a budget tripped just before a crash."""
        for handle, run in runs.items():
            if run.here and run.state.exceeded is not None:
                self._background(self._cancel(handle, run.state.exceeded.reason))

    async def stopped_before_turn(self, run: R) -> bool:
        """Stop a run before a turn its seconds budget would not see finish (`lookahead`): the
        budget trips as any other, this run ending first, then the rest of its subtree."""
        found = self._planner.overrun(self._runs, run.state.spec.handle, self._clock())
        if found is None:
            return False
        h, exceeded = found
        await self._apply(self._runs[h], m.BudgetExceeded(exceeded=exceeded))
        self._tripped(h, exceeded)
        # Ends before the subtree's cancel runs (the state steps before the first await), so
        # that cancel passes this run by.
        await self._apply(run, m.Cancel(reason=exceeded.reason, at=self._clock()))
        return True

    def _tripped(self, h: str, exceeded: m.Exceeded) -> None:
        self._metrics.budget_tripped(exceeded.which)
        log.info("run.budget_exceeded", run=h, reason=exceeded.reason)
        # In the background: the run calling this may be in the subtree it cancels.
        self._background(self._cancel(h, exceeded.reason))
