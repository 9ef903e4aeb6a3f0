"""One tool call of a sub-agent, to the upstream MCP server that offers the tool, until it has
a result the model can read.

Shell module: the call goes over the network (`upstream`), each send journaled first by the
run (`CallSide`). A call to a tool nobody offers, or whose arguments do not fit the tool's
schema after the hygiene's coercions (`hygiene`), gets an error result the model can read and
correct, never an exception; a call the user declined gets `DECLINED`. Neither is sent.

A call's time (`--tool-timeout`, 300 s) is the whole wait for its result: the sends, the
reconnects of a session that broke before a request left, and the sends again that `resend`'s
rule allows, from the first send on (a yes from the user starts it again; so does a restart).
A call journaled as sent whose result never was (the runtime stopped in between) starts with an
unknown outcome and goes through the same rule. With tracing on, each call runs inside its
`execute_tool` span (`spans`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import structlog

from luftpause.common import tracing
from luftpause.runtime.core import hygiene, resend
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.resend import Next, Outcome
from luftpause.runtime.loop import spans
from luftpause.runtime.loop.upstream import (
    TOOL_TIMEOUT,
    Attempt,
    Upstreams,
    UpstreamTool,
    result_text,
)

DECLINED = "Error: the user declined this tool call"

log = structlog.get_logger(service="runtime")


class CallSide(Protocol):
    """What a call needs of its run: its handle and state, journaling each send, asking again."""

    @property
    def handle(self) -> str: ...

    def sent(self, call_id: str) -> m.Sent | None:
        """The call as journaled sent, its result not (yet) journaled."""
        ...

    async def sending(self, call: m.ToolCall, *, resendable: bool, approval: bool) -> None:
        """Journal that `call` is about to be sent; returns once it is on disk."""
        ...

    async def ask_again(self, call: m.ToolCall) -> bool:
        """Ask the user whether to send `call` again after an unknown outcome (journaled)."""
        ...

    def unknown(self, then: str) -> None:
        """Count a call whose outcome was unknown, by what happened `then`."""
        ...


class ToolCaller:
    """Calls of every run through one set of upstream servers, each bounded by `timeout`."""

    def __init__(self, upstreams: Upstreams, *, timeout: float = TOOL_TIMEOUT) -> None:
        if timeout <= 0:
            raise ValueError(f"a tool call's timeout must be above 0 s, got {timeout}")
        self.upstreams = upstreams
        self.timeout = timeout

    async def settle(
        self,
        side: CallSide,
        call: m.ToolCall,
        offered: dict[str, UpstreamTool],
        *,
        approval: bool = False,
        allowed: bool = True,
    ) -> m.ToolResult:
        """The result of `call`, among the tools `offered` to its run; `approval` says the call
        needs the user's yes and `allowed` whether it was given."""
        if not tracing.enabled():
            return await self._settle(side, call, offered, approval, allowed)
        found = offered.get(call.name)
        with spans.tool(call, found.server if found is not None else None) as span:
            result = await self._settle(side, call, offered, approval, allowed)
            spans.tool_result(span, result)
            return result

    async def _settle(
        self,
        side: CallSide,
        call: m.ToolCall,
        offered: dict[str, UpstreamTool],
        approval: bool,
        allowed: bool,
    ) -> m.ToolResult:
        started = time.monotonic()
        refused = _refusal(call, offered)
        if side.sent(call.id) is None:
            if refused is not None:
                return refused
            if approval and not allowed:
                return m.ToolResult(call_id=call.id, name=call.name, content=DECLINED, ok=False)
            result = await self._until_settled(side, call, offered[call.name], approval)
        else:  # journaled as sent before a restart, its result never was
            tool = offered.get(call.name)
            first = Attempt(outcome=Outcome.UNKNOWN, why=resend.RESTARTED)
            result = await self._after(side, call, tool, first, None, refused)
        return _timed(result, time.monotonic() - started)

    async def _until_settled(
        self, side: CallSide, call: m.ToolCall, tool: UpstreamTool, approval: bool
    ) -> m.ToolResult:
        deadline = asyncio.get_running_loop().time() + self.timeout
        await side.sending(call, resendable=tool.resendable, approval=approval)
        attempt = await self._send(side.handle, call, tool, deadline)
        return await self._after(side, call, tool, attempt, deadline, None)

    async def _after(
        self,
        side: CallSide,
        call: m.ToolCall,
        tool: UpstreamTool | None,
        attempt: Attempt,
        deadline: float | None,
        refused: m.ToolResult | None,
    ) -> m.ToolResult:
        """Follow one send's outcome through `resend`'s rule to the call's result; `deadline`
        None: the call's time starts at its next send."""
        loop = asyncio.get_running_loop()
        unknown = ""  # why an earlier send's outcome is unknown, once one was
        while True:
            if attempt.outcome is Outcome.ANSWERED:
                assert attempt.result is not None
                text = result_text(attempt.result)
                ok = not attempt.result.is_error
                return m.ToolResult(call_id=call.id, name=call.name, content=text, ok=ok)
            if attempt.outcome is Outcome.NOT_SENT and not unknown:
                return resend.unsent_result(call, attempt.why, self.timeout)
            if attempt.outcome is Outcome.NOT_SENT:
                return resend.spent_result(call, unknown, self.timeout)
            unknown = attempt.why
            sent = side.sent(call.id)
            assert sent is not None, "an unknown outcome is of a call journaled as sent"
            step = resend.after_unknown(sent)
            if tool is None or refused is not None:
                step = Next.GIVE_UP  # no longer offered or no longer fits: it cannot go again
            if step is Next.SEND and deadline is not None and loop.time() >= deadline:
                side.unknown("spent")
                return resend.spent_result(call, unknown, self.timeout)
            if step is Next.GIVE_UP:
                side.unknown("reported")
                return resend.unknown_result(call, unknown)
            if step is Next.ASK:
                side.unknown("asked")
                if not await side.ask_again(call):
                    return resend.unknown_result(call, unknown, declined=True)
                deadline = None  # the user's yes starts the call's time again
            else:
                side.unknown("resent")
            assert tool is not None
            if deadline is None:
                deadline = loop.time() + self.timeout
            log.info("tool.resent", run=side.handle, call=call.id, tool=call.name, why=unknown)
            await side.sending(call, resendable=tool.resendable, approval=sent.approval)
            attempt = await self._send(side.handle, call, tool, deadline)

    async def _send(
        self, handle: str, call: m.ToolCall, tool: UpstreamTool, deadline: float
    ) -> Attempt:
        args = _arguments(call, tool)
        assert args is not None, "a call is checked before it is sent"
        key = resend.idempotency_key(handle, call.id)
        return await self.upstreams.attempt(tool, call.name, args, key, deadline)


def _arguments(call: m.ToolCall, tool: UpstreamTool) -> dict[str, Any] | None:
    args, _ = hygiene.check_arguments(call.arguments, tool.tool.input_schema or {})
    return args


def _refusal(call: m.ToolCall, offered: dict[str, UpstreamTool]) -> m.ToolResult | None:
    """Why `call` cannot be sent (an unknown tool, arguments that do not fit), or None."""
    tool = offered.get(call.name)
    if tool is None:
        names = ", ".join(sorted(offered)) or "none"
        why = f"Error: no tool named {call.name}; the tools are: {names}"
        return m.ToolResult(call_id=call.id, name=call.name, content=why, ok=False)
    args, why = hygiene.check_arguments(call.arguments, tool.tool.input_schema or {})
    if args is None:
        return m.ToolResult(call_id=call.id, name=call.name, content=f"Error: {why}", ok=False)
    return None


def _timed(result: m.ToolResult, seconds: float) -> m.ToolResult:
    return m.ToolResult(
        call_id=result.call_id,
        name=result.name,
        content=result.content,
        ok=result.ok,
        seconds=seconds,
    )
