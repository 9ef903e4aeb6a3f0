"""A run's round of tool calls, and the calls out while the runtime stops.

Shell module: the runtime (`loop.runtime`) hands it the round's calls still without a result and
the tools offered to the run; it asks the user first, in order, about every call that needs a
yes and was never sent, then settles the calls concurrently (`toolcalls`, each send journaled
before it leaves), and applies each result, journaled, as it arrives. It knows the runtime only
through the callbacks it is built with (`Apply`, `Ask`), and a run only as something with a
state machine's state (`budget.HasState`).

Stopping (`drain`): nothing new is sent and no turn begins (`held_while_stopping`), and the
calls already sent get up to a grace period to return and be journaled, so a stop does not
leave their outcome unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from luftpause.runtime.core import machine as m
from luftpause.runtime.core.budget import HasState
from luftpause.runtime.loop import failpoints
from luftpause.runtime.loop.toolcalls import ToolCaller
from luftpause.runtime.loop.upstream import UpstreamTool
from luftpause.runtime.server.metrics import UNKNOWN_TOOL, RuntimeMetrics

R = TypeVar("R", bound=HasState)
Apply = Callable[[R, m.Event], Awaitable[None]]  # step the run's state and journal the step
Ask = Callable[[R, m.ToolCall], Awaitable[bool]]  # the user's answer about a call, journaled

log = structlog.get_logger(service="runtime")


def needs_approval(tool: UpstreamTool | None, call: m.ToolCall, spec: m.RunSpec) -> bool:
    """The call waits for the user's yes: its tool is destructive, or spawn named it."""
    return tool is not None and (tool.destructive or call.name in spec.approve_tools)


class Rounds(Generic[R]):
    """Every run's rounds of tool calls, through one `ToolCaller`."""

    def __init__(
        self, caller: ToolCaller, metrics: RuntimeMetrics, apply: Apply[R], ask: Ask[R]
    ) -> None:
        self.caller = caller
        self.metrics = metrics
        self._apply = apply
        self._ask = ask
        self.stopping = False
        self._out = 0  # calls sent whose result is not journaled yet
        self._idle = asyncio.Event()
        self._idle.set()

    async def call(
        self, run: R, calls: tuple[m.ToolCall, ...], offered: dict[str, UpstreamTool]
    ) -> None:
        """Settle every call of the round that has no result yet (the module docstring)."""
        spec = run.state.spec
        approval = {c.id: needs_approval(offered.get(c.name), c, spec) for c in calls}
        allowed: dict[str, bool] = {}
        for c in calls:
            if approval[c.id] and run.state.sent_call(c.id) is None:
                answer = run.state.approval(c.id)
                allowed[c.id] = await self._ask(run, c) if answer is None else answer
        async with asyncio.TaskGroup() as group:
            for c in calls:
                side = _Side(self, run)
                settled = self._settle(side, c, offered, approval[c.id], allowed.get(c.id, True))
                group.create_task(settled, name=f"tool call {c.id}")

    async def drain(self, grace: float) -> None:
        """Begin nothing more; wait up to `grace` seconds for the calls out to be journaled."""
        self.stopping = True
        if self._out and grace > 0:
            log.info("runtime.draining", calls=self._out, grace=grace)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._idle.wait()

    async def held_while_stopping(self) -> None:
        """While the runtime stops, nothing new begins: wait here for the stop's cancel."""
        if self.stopping:
            await asyncio.get_running_loop().create_future()

    async def _settle(
        self,
        side: _Side[R],
        call: m.ToolCall,
        offered: dict[str, UpstreamTool],
        approval: bool,
        allowed: bool,
    ) -> None:
        try:
            result = await self.caller.settle(
                side, call, offered, approval=approval, allowed=allowed
            )
            failpoints.hit(failpoints.AFTER_RESULT)
            tool = result.name if result.name in offered else UNKNOWN_TOOL
            self.metrics.tool_called(tool, result.ok)
            await self._apply(side.run, m.CallReturned(result=result))
        finally:
            if side.out:
                side.out = False
                self._out -= 1
                if not self._out:
                    self._idle.set()

    async def _sending(self, side: _Side[R], event: m.CallSending) -> None:
        """Journal a send, then count the call out until its result is journaled."""
        await self.held_while_stopping()
        failpoints.hit(failpoints.BEFORE_SEND)
        await self._apply(side.run, event)
        if not side.out:
            side.out = True
            self._out += 1
            self._idle.clear()


@dataclass(eq=False)
class _Side(Generic[R]):
    """A run as one of its tool calls sees it (`toolcalls.CallSide`)."""

    rounds: Rounds[R]
    run: R
    out: bool = False  # the call was sent and its result is not journaled yet

    @property
    def handle(self) -> str:
        return self.run.state.spec.handle

    def sent(self, call_id: str) -> m.Sent | None:
        return self.run.state.sent_call(call_id)

    async def sending(self, call: m.ToolCall, *, resendable: bool, approval: bool) -> None:
        event = m.CallSending(call_id=call.id, resendable=resendable, approval=approval)
        await self.rounds._sending(self, event)

    async def ask_again(self, call: m.ToolCall) -> bool:
        return await self.rounds._ask(self.run, call)

    def unknown(self, then: str) -> None:
        self.rounds.metrics.tool_unknown(then)
