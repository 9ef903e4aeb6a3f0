"""Asking the harness user about a sub-agent's tool call while their `await` or `run` covers it.

Shell module (the `mcp` SDK's request context). A client that advertises form elicitation is
asked with a one-field form (allow) about each approval pending in the runs it waits for (and
every run below them):

    protocol <= 2025-11-25   an elicitation/create request on the session, mid-call; the answer
                             goes to `Runtime.approve` and the wait goes on
    protocol >= 2026-07-28   the call ends with an input-required result carrying the question
                             (key approve/<run>/<call>); the client asks the user and repeats
                             the call with the answer, which is applied before waiting again

Declining or cancelling the form declines the call. Other clients get the plain wait, and
answer with the `approve` tool. Each question costs the asking session's attention budget
(`question_gate`): past it, or while the session is away, questions wait unasked (oldest first)
until the budget frees or away is switched off; `approve` answers them meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from mcp.server.elicitation import AcceptedElicitation, render_elicitation_schema
from mcp.server.mcpserver import Context
from mcp.types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import is_version_at_least
from pydantic import BaseModel, Field

from luftpause.runtime.core.errors import RequestError
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.people.approvals import Approval

INPUT_REQUIRED_VERSION = "2026-07-28"
_KEY_PREFIX = "approve/"
_OVER = frozenset({"finished", "failed", "cancelled"})
_SLACK = 0.05  # past the moment the budget frees, so the ask finds it free


class AllowForm(BaseModel):
    allow: bool = Field(description="let the sub-agent make this tool call")


def can_elicit(ctx: Context[Any, Any] | None) -> bool:
    """The client advertised form elicitation."""
    if ctx is None:
        return False
    try:
        caps = ctx.client_capabilities
    except (AttributeError, LookupError, ValueError):
        return False
    ask = caps.elicitation if caps is not None else None
    return ask is not None and (ask.form is not None or ask.url is None)


def input_required(ctx: Context[Any, Any]) -> bool:
    version = ctx.protocol_version
    return version is not None and is_version_at_least(version, INPUT_REQUIRED_VERSION)


def question(handle: str, approval: Approval) -> str:
    call = approval.call
    return (
        f"The sub-agent {handle} wants to call {call.name} with {call.arguments}. "
        "Allow this tool call?"
    )


def _allow(answer: Any) -> bool:
    if isinstance(answer, AcceptedElicitation):
        return bool(answer.data.allow)
    if isinstance(answer, ElicitResult):
        return answer.action == "accept" and bool((answer.content or {}).get("allow"))
    return False


async def apply_answers(runtime: Runtime, answers: Mapping[str, Any]) -> None:
    """Answers to our questions (input responses), each to the approval it was asked about."""
    for key, answer in answers.items():
        if not key.startswith(_KEY_PREFIX) or key.count("/") != 2:
            continue
        _, handle, call_id = key.split("/")
        if isinstance(answer, Mapping):
            try:
                answer = ElicitResult.model_validate(answer)
            except ValueError:
                continue
        # Answered meanwhile (approve, another client) or the run is gone: nothing to do.
        with contextlib.suppress(RequestError):
            await runtime.approve(handle, _allow(answer), call_id=call_id)


async def covering_wait(
    runtime: Runtime,
    handles: list[str],
    mode: str,
    timeout: float,
    ctx: Context[Any, Any] | None,
    *,
    request_state: str | None = None,
    session: str = "mcp",
) -> list[dict[str, Any]] | InputRequiredResult:
    """`await` for `handles`, asking the client about their approvals as the docstring says.

    `request_state` rides an input-required result back to the repeated call (`run` keeps its
    handle there, so the repeat waits for the same run instead of spawning another). Questions
    go oldest first, each only when the attention budget of `session` (the MCP session) lets
    it be asked (`question_gate`); a held one waits until the budget frees or away is switched off.
    """
    if ctx is None or not can_elicit(ctx):
        return await runtime.await_runs(handles, mode, timeout)
    modern = input_required(ctx)
    if modern:
        await apply_answers(runtime, ctx.input_responses or {})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        pending = runtime.approvals.pending(handles)
        held = None
        if pending:
            handle, approval = pending[0]
            held = await runtime.questions.ask(session, handle, approval)
            if held is None and modern:
                return _input_required(handle, approval, request_state)
            if held is None:
                answer = await ctx.elicit(question(handle, approval), AllowForm)
                with contextlib.suppress(RequestError):
                    await runtime.approve(handle, _allow(answer), call_id=approval.call.id)
                continue
        remaining = max(0.0, deadline - loop.time())
        if held is not None and held.until is not None:  # the budget frees: ask then
            remaining = min(remaining, max(0.0, held.until - runtime.questions.clock()) + _SLACK)
        with runtime.approvals.watch() as changed, runtime.questions.watching(changed):
            if runtime.approvals.pending(handles) != pending:
                continue  # one began (or ended) while we looked: look again
            out = await runtime.await_runs(handles, mode, remaining, interrupt=changed)
        if _settled(out, mode) or loop.time() >= deadline:
            return out


def _settled(runs: list[dict[str, Any]], mode: str) -> bool:
    """The runs `await` waits for are over (all, or any, of those that exist)."""
    over = [r["state"] in _OVER for r in runs if r["state"] != "unknown"]
    if not over:
        return True
    return any(over) if mode == "any" else all(over)


def input_request(handle: str, approval: Approval) -> tuple[str, ElicitRequest]:
    """The question about one approval as an input request, with its key."""
    key = f"{_KEY_PREFIX}{handle}/{approval.call.id}"
    params = ElicitRequestFormParams(
        message=question(handle, approval), requested_schema=render_elicitation_schema(AllowForm)
    )
    return key, ElicitRequest(params=params)


def _input_required(
    handle: str, approval: Approval, request_state: str | None
) -> InputRequiredResult:
    key, request = input_request(handle, approval)
    return InputRequiredResult(input_requests={key: request}, request_state=request_state)
