"""Budgets and tool approval end to end: the official `mcp` client (both protocol modes) ->
runtime -> dataplane -> simulated engines, tool calls to fake-mcp (whose delete_record is
destructiveHint: true). The stack is `test_runtime`'s fixture.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp.types import ElicitRequestParams, ElicitResult, ErrorData

from luftpause.testkit.procs import free_port
from tests.integration.test_runtime import TOOL_ROUNDS, RuntimeStack, call, rt

pytestmark = pytest.mark.asyncio(loop_scope="module")
__all__ = ["rt"]

DECLINED = "Error: the user declined this tool call"


async def wait_state(c: Client, handle: str, state: str) -> dict[str, Any]:
    """Poll status until the run is in `state` (callers bound this with a timeout)."""
    while True:
        [run] = (await call(c, "status", {"handles": [handle]}))["runs"]
        if run["state"] == state:
            return run
        await asyncio.sleep(0.05)


def journal(rt: RuntimeStack, state_dir: str = "state") -> list[dict[str, Any]]:
    path = rt.workdir / state_dir / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_tool_call_budget_cancels_the_whole_subtree_with_the_reason(
    rt: RuntimeStack,
) -> None:
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        parent = (await call(c, "run", {"task": "p", "maxToolCalls": 0, "budgetToolCalls": 2}))[
            "handle"
        ]
        kids = [
            (await call(c, "spawn", {"task": f"k{i}", "tools": ["lookup"], "parent": parent}))[
                "handle"
            ]
            for i in range(2)
        ]
        out = (await call(c, "await", {"handles": kids, "timeout": 25}))["runs"]
        [status] = (await call(c, "status", {"handles": [parent]}))["runs"]
        late = await c.call_tool("spawn", {"task": "late", "parent": parent})
    assert [r["state"] for r in out] == ["cancelled", "cancelled"], out
    reasons = {r["error"] for r in out}
    assert len(reasons) == 1 and reasons.pop() in (
        "budget exceeded: toolCalls 3/2",
        "budget exceeded: toolCalls 4/2",
    )
    assert sum(r["toolCalls"] for r in out) < 2 * TOOL_ROUNDS
    b = status["budget"]
    assert b["limits"] == {"toolCalls": 2} and b["exceeded"]["which"] == "toolCalls"
    assert b["used"]["toolCalls"] >= 3 and b["exceeded"]["limit"] == 2
    assert late.is_error and "budget exceeded" in str(late.content)


async def test_a_seconds_budget_trips_by_its_timer_while_the_subtree_waits_on_a_tool(
    rt: RuntimeStack,
) -> None:
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        args = {"task": "idle", "tools": ["deep_search"], "budgetSeconds": 0.5, "timeout": 20}
        out = await call(c, "run", args)
    assert out["state"] == "cancelled" and out["toolCalls"] == 0
    assert out["error"].startswith("budget exceeded: seconds ")
    assert out["budget"]["exceeded"]["which"] == "seconds"


async def test_a_destructive_call_waits_for_approval_and_a_declined_one_reaches_the_model(
    rt: RuntimeStack,
) -> None:
    before = (await rt.tool_calls())["delete_record"]
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        args = {"task": "tidy up", "tools": ["delete_record"], "maxToolCalls": 1}
        handle = (await call(c, "spawn", args))["handle"]
        waiting = await wait_state(c, handle, "AwaitingApproval")
        answer = await call(c, "approve", {"handle": handle, "allow": False})
        [out] = (await call(c, "await", {"handles": [handle], "timeout": 20}))["runs"]
    assert waiting["pendingApproval"]["tool"] == "delete_record"
    assert "record_id" in waiting["pendingApproval"]["arguments"]
    assert answer == {"handle": handle, "tool": "delete_record", "allow": False}
    assert out["state"] == "finished" and out["failedToolCalls"] == 1
    assert (await rt.tool_calls())["delete_record"] == before
    [round_] = [r for r in journal(rt) if r["run"] == handle and r["type"] == "round"]
    assert round_["results"][0]["content"] == DECLINED


async def test_approve_tools_names_a_tool_whose_allowed_call_then_runs(rt: RuntimeStack) -> None:
    before = (await rt.tool_calls())["lookup"]
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        args = {"task": "t", "tools": ["lookup"], "maxToolCalls": 1, "approveTools": ["lookup"]}
        handle = (await call(c, "spawn", args))["handle"]
        await wait_state(c, handle, "AwaitingApproval")
        await call(c, "approve", {"handle": handle, "allow": True})
        [out] = (await call(c, "await", {"handles": [handle], "timeout": 20}))["runs"]
    assert out["state"] == "finished" and out["toolCalls"] == 1 and out["failedToolCalls"] == 0
    assert (await rt.tool_calls())["lookup"] == before + 1


def answering(allow: bool, asked: list[str]) -> Any:
    async def elicit(
        context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"allow": allow})

    return elicit


@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["2025-11-25", "2026-07-28"])
@pytest.mark.parametrize("allow", [True, False], ids=["allowed", "declined"])
async def test_a_client_that_elicits_is_asked_during_run_and_its_answer_reaches_the_run(
    rt: RuntimeStack, mode: str, allow: bool
) -> None:
    before = (await rt.tool_calls())["delete_record"]
    asked: list[str] = []
    client = Client(rt.mcp_url, mode=mode, elicitation_callback=answering(allow, asked))
    async with asyncio.timeout(30), client as c:
        args = {"task": "tidy", "tools": ["delete_record"], "maxToolCalls": 1, "timeout": 20}
        out = await call(c, "run", args)
    assert len(asked) == 1 and "delete_record" in asked[0]
    assert out["state"] == "finished" and out["failedToolCalls"] == (0 if allow else 1)
    assert (await rt.tool_calls())["delete_record"] == before + (1 if allow else 0)


async def test_an_approval_is_asked_again_after_a_restart_until_answered_then_never_again(
    rt: RuntimeStack,
) -> None:
    port = free_port()
    state_dir = rt.workdir / "approval-state"
    proc = await rt.start_runtime(port, state_dir, "runtime-approval")
    url = f"http://127.0.0.1:{port}/mcp"
    args = {"task": "t", "tools": ["deep_search"], "maxToolCalls": 1}
    try:
        async with asyncio.timeout(40):
            async with Client(url) as c:
                args["approveTools"] = ["deep_search"]
                handle = (await call(c, "spawn", args))["handle"]
                await wait_state(c, handle, "AwaitingApproval")
            await proc.kill()
            proc = await rt.start_runtime(port, state_dir, "runtime-approval")
            async with Client(url) as c:
                await wait_state(c, handle, "AwaitingApproval")  # unanswered: asked again
                await call(c, "approve", {"handle": handle, "allow": True})
                await wait_state(c, handle, "tools")  # deep_search runs (3 s)
            await proc.kill()  # answered, the round not yet journaled
            proc = await rt.start_runtime(port, state_dir, "runtime-approval")
            async with Client(url) as c:
                [out] = (await call(c, "await", {"handles": [handle], "timeout": 20}))["runs"]
    finally:
        await proc.stop()
    assert out["state"] == "finished" and out["toolCalls"] == 1 and out["failedToolCalls"] == 0
    records = [r for r in journal(rt, "approval-state") if r["run"] == handle]
    assert [r["type"] for r in records].count("approval") == 1
    assert [r["type"] for r in records].count("turn") == 1


async def test_decide_with_labels_scores_them_through_the_dataplane(rt: RuntimeStack) -> None:
    labels = ["urgent", "lookup"]
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        out = await call(c, "decide", {"input": "the site is down", "labels": labels})
        unlabelled = await c.call_tool("decide", {"input": "the site is down"})
    assert out["label"] in labels and out["model"] == "luftpause-sim"
    assert set(out["probabilities"]) | set(out["unscored"]) == set(labels)
    assert unlabelled.is_error and "needs a model" in str(unlabelled.content)
