"""Drives the pure engine core in real time on the asyncio loop.

Shell layer: owns the clock and the sleeping. One task runs the engine loop: it asks the core
for the next iteration, sleeps the iteration's duration (divided by the time scale), then
hands each request's new tokens to the HTTP handler waiting on it. Simulated time follows the
real clock while idle and advances by whole iterations while busy, so coarse timers and a busy
event loop shift the schedule without changing the simulated throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from luftpause.testkit.engine.core import EngineCore
from luftpause.testkit.engine.params import EngineParams
from luftpause.testkit.engine.records import EngineStats, Step, Submission

log = structlog.get_logger(__name__)

# How far (real seconds) a busy engine may run behind its schedule and still catch up;
# beyond that the schedule restarts from now instead of bursting through the backlog.
MAX_DEBT_S = 0.25


class SimClock:
    """Maps real monotonic time to simulated milliseconds."""

    def __init__(self, time_scale: float, now: Callable[[], float] = time.monotonic) -> None:
        self.time_scale = time_scale
        self._now = now
        self._t0 = now()

    def sim_ms(self) -> float:
        return (self._now() - self._t0) * 1000.0 * self.time_scale

    def real_delay(self, sim_ms: float) -> float:
        """Real seconds from now until simulated time `sim_ms`."""
        return self._t0 + sim_ms / 1000.0 / self.time_scale - self._now()


class Handle:
    """The HTTP side of one request: its tokens as they are emitted, and its end."""

    __slots__ = ("cached", "done", "finished", "generated", "sub", "tokens")

    def __init__(self, sub: Submission, stream: bool) -> None:
        loop = asyncio.get_running_loop()
        self.sub = sub
        self.cached = 0
        self.generated = 0
        self.tokens: asyncio.Queue[int] | None = asyncio.Queue() if stream else None
        self.done: asyncio.Future[None] = loop.create_future()
        # Not `done.done()`: cancelling a handler that awaits `done` cancels `done` too.
        self.finished = False


class EngineDriver:
    """The engine core plus the task that runs it."""

    def __init__(self, params: EngineParams, clock: SimClock) -> None:
        self.core = EngineCore(params)
        self.clock = clock
        self._handles: dict[str, Handle] = {}
        self._wake = asyncio.Event()
        self._busy_until = 0.0
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        self.busy_ms = 0.0
        # Real seconds the loop fell behind the simulated schedule (a busy host shows here).
        self.lag_s = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for handle in self._handles.values():
            if not handle.done.done():
                handle.done.set_exception(ConnectionAbortedError("engine stopped"))
        self._handles.clear()

    def submit(self, sub: Submission, *, stream: bool) -> Handle:
        """Queue a request; raises core.RequestTooLarge when it can never fit."""
        self.core.submit(sub)
        handle = Handle(sub, stream)
        self._handles[sub.rid] = handle
        self._wake.set()
        return handle

    def release(self, rid: str) -> None:
        """Forget a request; aborts it in the engine when it has not finished."""
        handle = self._handles.pop(rid, None)
        if handle is not None and not handle.finished:
            self.core.abort(rid)
            self._wake.set()

    def reset_counters(self) -> None:
        self.core.reset_counters()
        self.steps, self.busy_ms = 0, 0.0

    def stats(self) -> EngineStats:
        return self.core.stats()

    async def _run(self) -> None:
        busy = False
        while True:
            now = self.clock.sim_ms()
            if busy and now - self._busy_until < MAX_DEBT_S * 1000.0 * self.clock.time_scale:
                now = self._busy_until  # back to back: late wake-ups are caught up
            try:
                step = self.core.step(max(now, self._busy_until))
            except Exception:
                log.exception("engine step failed")
                raise
            if step is None:
                busy = False
                self._wake.clear()
                await self._wake.wait()
                continue
            busy = True
            self.steps += 1
            self.busy_ms += step.duration_ms
            self._busy_until = step.ends_at
            delay = self.clock.real_delay(step.ends_at)
            self.lag_s = max(0.0, -delay)
            await asyncio.sleep(max(0.0, delay))
            self._deliver(step)

    def _deliver(self, step: Step) -> None:
        handles = self._handles
        for adm in step.admitted:
            if (h := handles.get(adm.rid)) is not None:
                h.cached = adm.cached_tokens
        for rid in step.emitted:
            if (h := handles.get(rid)) is not None:
                if h.tokens is not None:
                    h.tokens.put_nowait(h.generated)
                h.generated += 1
        for rid in step.finished:
            if (h := handles.get(rid)) is not None and not h.finished:
                h.finished = True
                if not h.done.done():
                    h.done.set_result(None)
