"""`elicitation`: questions to the harness user about a sub-agent's tool call, with a real `Runtime`
(the engine simulator as its model, the fake MCP server's destructive `delete_record` as the
tool that needs approval, on 127.0.0.1); the client is the official `mcp` client on the
runtime server's in-memory connection, in both protocol eras.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.types import ElicitRequestFormParams, ElicitRequestParams, ElicitResult, ErrorData

from luftpause.runtime.core import machine as m
from luftpause.runtime.loop.runtime import Runtime, new_handle
from luftpause.runtime.loop.toolcalls import DECLINED
from luftpause.runtime.people import elicitation
from luftpause.runtime.people.approvals import Approval
from luftpause.runtime.server.app import build_server
from tests.runtime.loopback import MODEL, FakeMcp

WAIT = 10.0
ERAS = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])


def spec(task: str = "tidy up", **kw: Any) -> m.RunSpec:
    kw.setdefault("tools", ("delete_record",))
    return m.RunSpec(handle=new_handle(), task=task, model=MODEL, **kw)


async def waiting(runtime: Runtime, **kw: Any) -> tuple[str, Approval]:
    """A run waiting for the user's approval of its delete_record call."""
    handle = await runtime.spawn(spec(**kw))
    async with asyncio.timeout(WAIT):
        while not runtime.approvals.pending([handle]):
            await asyncio.sleep(0.01)
    [(_, approval)] = runtime.approvals.pending([handle])
    return handle, approval


async def outcome(runtime: Runtime, handle: str) -> dict[str, Any]:
    [summary] = await runtime.await_runs([handle], "all", WAIT)
    assert summary["state"] == "finished", summary
    return summary


def answering(allow: bool | None, asked: list[str]) -> Any:
    """An elicitation callback that accepts with `allow`, or declines the form when None."""

    async def elicit(
        context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        asked.append(params.message)
        if allow is None:
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content={"allow": allow})

    return elicit


# --- the question ---


async def test_the_question_names_the_run_the_tool_and_its_arguments(runtime: Runtime) -> None:
    handle, approval = await waiting(runtime)
    text = elicitation.question(handle, approval)
    assert handle in text and "delete_record" in text and approval.call.arguments in text
    assert text.endswith("Allow this tool call?")


async def test_an_input_request_is_keyed_by_run_and_call_and_asks_for_one_boolean(
    runtime: Runtime,
) -> None:
    handle, approval = await waiting(runtime)
    key, request = elicitation.input_request(handle, approval)
    assert key == f"approve/{handle}/{approval.call.id}"
    assert isinstance(request.params, ElicitRequestFormParams)
    assert request.params.message == elicitation.question(handle, approval)
    schema = request.params.requested_schema
    assert schema["properties"]["allow"]["type"] == "boolean" and schema["required"] == ["allow"]


def test_without_a_request_context_nobody_can_be_asked() -> None:
    assert not elicitation.can_elicit(None)


async def test_without_a_request_context_the_wait_is_a_plain_await(runtime: Runtime) -> None:
    handle, _ = await waiting(runtime)
    out = await elicitation.covering_wait(runtime, [handle], "all", 0.05, None)
    assert isinstance(out, list) and out[0]["state"] == "AwaitingApproval"


# --- answers carried by a repeated call (input responses) ---


@pytest.mark.parametrize(
    ("answer", "allowed"),
    [
        ({"action": "accept", "content": {"allow": True}}, True),
        ({"action": "accept", "content": {"allow": False}}, False),
        ({"action": "decline"}, False),
        ({"action": "cancel"}, False),
        (ElicitResult(action="accept", content={"allow": True}), True),
        (ElicitResult(action="accept"), False),
    ],
)
async def test_an_answer_reaches_the_approval_it_was_asked_about(
    runtime: Runtime, tools: FakeMcp, answer: Any, allowed: bool
) -> None:
    handle, approval = await waiting(runtime)
    await elicitation.apply_answers(runtime, {f"approve/{handle}/{approval.call.id}": answer})
    summary = await outcome(runtime, handle)
    assert summary["failedToolCalls"] == (0 if allowed else 1)
    assert tools.stats.calls["delete_record"] == (1 if allowed else 0)
    if not allowed:
        [result] = [msg for msg in runtime.runs[handle].state.messages if msg["role"] == "tool"]
        assert result["content"] == DECLINED


async def test_answers_that_are_not_ours_or_do_not_fit_leave_the_approval_waiting(
    runtime: Runtime,
) -> None:
    handle, approval = await waiting(runtime)
    yes = {"action": "accept", "content": {"allow": True}}
    await elicitation.apply_answers(
        runtime,
        {
            "someone-else/key": yes,
            f"approve/{handle}": yes,
            f"approve/{handle}/{approval.call.id}/extra": yes,
            f"approve/{handle}/call-other": yes,  # not the call it waits on
            "approve/run-nope/c1": yes,  # no such run
            f"approve/{handle}/{approval.call.id}": {"action": "maybe"},  # not an answer
        },
    )
    assert runtime.approvals.pending([handle]) == [(handle, approval)]
    assert runtime.runs[handle].state.phase is m.Phase.AWAITING_APPROVAL


# --- a client that can be asked, in both protocol eras ---


@ERAS
@pytest.mark.parametrize("allow", [True, False, None], ids=["allowed", "refused", "declined"])
async def test_run_asks_a_client_that_elicits_and_its_answer_reaches_the_run(
    runtime: Runtime, tools: FakeMcp, mode: str, allow: bool | None
) -> None:
    asked: list[str] = []
    server = build_server(runtime, default_model=MODEL)
    client = Client(server, mode=mode, elicitation_callback=answering(allow, asked))
    async with asyncio.timeout(WAIT), client as c:
        result = await c.call_tool("run", {"task": "tidy", "tools": ["delete_record"]})
    assert not result.is_error and result.structured_content is not None
    out = result.structured_content
    assert len(asked) == 1 and "delete_record" in asked[0] and out["handle"] in asked[0]
    assert out["state"] == "finished" and out["failedToolCalls"] == (0 if allow else 1)
    assert tools.stats.calls["delete_record"] == (1 if allow else 0)
    assert list(runtime.runs) == [out["handle"]]  # the repeated call did not spawn again


@ERAS
async def test_await_asks_about_an_approval_in_a_run_below_the_ones_awaited(
    runtime: Runtime, mode: str
) -> None:
    parent = await runtime.spawn(spec("parent", tools=("deep_search",)))
    child, _ = await waiting(runtime, parent=parent)
    asked: list[str] = []
    server = build_server(runtime, default_model=MODEL)
    client = Client(server, mode=mode, elicitation_callback=answering(True, asked))
    async with asyncio.timeout(WAIT), client as c:
        result = await c.call_tool("await", {"handles": [parent], "timeout": 1})
    assert not result.is_error and result.structured_content is not None
    assert len(asked) == 1 and child in asked[0]
    assert runtime.approvals.pending([parent]) == []
    [summary] = await runtime.await_runs([child], "all", WAIT)
    assert summary["state"] == "finished" and summary["failedToolCalls"] == 0


@ERAS
async def test_a_client_that_cannot_be_asked_gets_the_plain_wait_and_answers_with_approve(
    runtime: Runtime, mode: str
) -> None:
    handle, _ = await waiting(runtime)
    client = Client(build_server(runtime, default_model=MODEL), mode=mode)
    async with asyncio.timeout(WAIT), client as c:
        result = await c.call_tool("await", {"handles": [handle], "timeout": 0.1})
        assert result.structured_content is not None
        assert result.structured_content["runs"][0]["state"] == "AwaitingApproval"
        await c.call_tool("approve", {"handle": handle, "allow": True})
    summary = await outcome(runtime, handle)
    assert summary["failedToolCalls"] == 0
