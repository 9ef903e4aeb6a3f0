"""The imperative shell around the decision core: owns the state, applies events, acts.

Shell layer: may read the clock and resolve futures; must not decide anything itself. Every
decision comes from `core.decide`. Runs on one asyncio loop, so events are applied one at a
time in arrival order without locks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog

from luftpause.common.config import Endpoint
from luftpause.scheduler.core.decide import DEFAULT_RULES, decide, initial_state
from luftpause.scheduler.core.events import (
    Action,
    DataplaneReleased,
    Event,
    Place,
    Reject,
    RunExpired,
    RunTaken,
    Tick,
    TurnAbandoned,
    TurnExpired,
)
from luftpause.scheduler.core.model import DATAPLANE_GRACE_S, Rules
from luftpause.scheduler.core.state import State
from luftpause.scheduler.metrics import SchedulerMetrics

log = structlog.get_logger(__name__)


class SchedulerError(Exception):
    """Root of the scheduler's errors.

    SchedulerError
     └── TurnRejected   the turn can never be placed (unknown model); retrying cannot help
    """

    code = "scheduler_error"
    retryable = False


class TurnRejected(SchedulerError):
    """Refused: an unknown model, or (`rate_limited`) a turn no rate-limit window can take."""

    code = "unknown_model"

    def __init__(self, message: str, *, rate_limited: bool = False, retry_after_s: float = 0.0):
        super().__init__(message)
        self.rate_limited = rate_limited
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class _Waiters:
    futures: list[asyncio.Future[Place]] = field(default_factory=list)


class SchedulerHost:
    """Holds the current state and the admissions waiting on it."""

    def __init__(
        self,
        endpoints: Iterable[Endpoint],
        *,
        dataplane_grace_s: float = DATAPLANE_GRACE_S,
        rules: Rules = DEFAULT_RULES,
        clock: Callable[[], float] = time.monotonic,
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        self.state: State = initial_state(
            endpoints, dataplane_grace_s=dataplane_grace_s, rules=rules
        )
        self.clock = clock
        self.metrics = metrics or SchedulerMetrics()
        self.metrics.bind(lambda: self.state, clock)
        self._waiters: dict[str, _Waiters] = {}
        self._open_version = self.state.open_version
        self._open_listeners: list[Callable[[State], None]] = []
        self._taken_listeners: list[Callable[[RunTaken], None]] = []
        self._watchers: set[asyncio.Event] = set()
        self._wake: asyncio.TimerHandle | None = None
        self._wake_at = -1.0

    def now(self) -> float:
        return self.clock()

    def on_open_changed(self, listener: Callable[[State], None]) -> None:
        """Call `listener(state)` after every event that may have changed the open replicas."""
        self._open_listeners.append(listener)

    def watch(self) -> asyncio.Event:
        """An event set after every applied event (the state may have changed); `unwatch` it."""
        changed = asyncio.Event()
        self._watchers.add(changed)
        return changed

    def unwatch(self, changed: asyncio.Event) -> None:
        self._watchers.discard(changed)

    def on_run_taken(self, listener: Callable[[RunTaken], None]) -> None:
        """Call `listener(action)` for every run whose turn came through another dataplane."""
        self._taken_listeners.append(listener)

    def apply(self, event: Event) -> tuple[Action, ...]:
        """Feed one event to the core and carry out its actions."""
        self.state, actions = decide(self.state, event)
        for action in actions:
            self._act(action)
        if self.state.open_version != self._open_version:
            self._open_version = self.state.open_version
            for listener in self._open_listeners:
                listener(self.state)
        for changed in self._watchers:
            changed.set()
        if self.state.wake_at != self._wake_at:
            self._schedule_wake(self.state.wake_at)
        return actions

    def _schedule_wake(self, at: float) -> None:
        """Tick when a turn held for a rate-limit window fits by refill (`State.wake_at`)."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        self._wake_at = at
        if at < 0:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # applied outside a loop (tests): the 1 s tick still comes
        self._wake = loop.call_later(max(at - self.now(), 0.0) + 0.001, self._woken)

    def _woken(self) -> None:
        self._wake = None
        self._wake_at = -1.0
        self.apply(Tick(at=self.now()))

    def _act(self, action: Action) -> None:
        match action:
            case Place():
                self.metrics.placed(action, self.state)
                for fut in self._waiters.pop(action.turn_id, _Waiters()).futures:
                    if not fut.done():
                        fut.set_result(action)
            case Reject():
                limited = action.code == "rate_limited"
                if limited:
                    self.metrics.refused_for_budget.inc()
                for fut in self._waiters.pop(action.turn_id, _Waiters()).futures:
                    if not fut.done():
                        fut.set_exception(
                            TurnRejected(
                                action.message,
                                rate_limited=limited,
                                retry_after_s=action.retry_after_s,
                            )
                        )
            case TurnExpired():
                log.warning("turn expired", turn_id=action.turn_id, replica=action.replica_id)
                self.metrics.turn_expired()
            case RunExpired():
                log.info("run expired", run_id=action.run_id)
            case RunTaken():
                for listener in self._taken_listeners:
                    listener(action)
            case DataplaneReleased():
                log.warning(
                    "dataplane gone past its grace period: its turns were released",
                    dataplane=action.dataplane,
                    turns=action.turns,
                )

    def wait_for(self, turn_id: str) -> asyncio.Future[Place]:
        """A future resolved when `turn_id` is placed (register before applying Admit)."""
        fut: asyncio.Future[Place] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(turn_id, _Waiters()).futures.append(fut)
        return fut

    def give_up(self, turn_id: str, fut: asyncio.Future[Place]) -> None:
        """The admission behind `fut` was cancelled by its client."""
        waiters = self._waiters.get(turn_id)
        if waiters is not None and fut in waiters.futures:
            waiters.futures.remove(fut)
            if waiters.futures:
                return  # another admission of the same turn is still waiting
            del self._waiters[turn_id]
        state = self.state
        if turn_id in state.held or turn_id in state.budget_held or turn_id in state.turns:
            self.metrics.abandoned(self.state, turn_id)
            self.apply(TurnAbandoned(at=self.now(), turn_id=turn_id))
