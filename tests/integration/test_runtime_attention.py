"""A person's attention as a budget, end to end: the official `mcp` client (eliciting, both
protocol eras) -> runtime -> dataplane -> simulated engines, tool calls to fake-mcp (whose
delete_record is destructiveHint: true). The stack is `test_runtime`'s fixture; each test that
needs its own budget starts its own runtime process on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from mcp import Client

from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.waits import READY_SECONDS
from tests.integration.test_runtime import RuntimeStack, call, rt
from tests.integration.test_runtime_control import answering, journal, wait_state
from tests.integration.test_runtime_tasks import Tasks

pytestmark = pytest.mark.asyncio(loop_scope="module")
__all__ = ["rt"]

TIDY = {"task": "tidy up", "tools": ["delete_record"], "maxToolCalls": 1}


@asynccontextmanager
async def runtime(rt: RuntimeStack, name: str, *flags: str) -> AsyncIterator[str]:
    """A runtime of its own on the stack, started with `flags`; its base URL."""
    port = free_port()
    args = [*rt.runtime_args(port, rt.workdir / name), *flags]
    proc = Proc(args, name=name, log_path=rt.workdir / f"{name}.log")
    await proc.start()
    try:
        await proc.wait_http(f"http://127.0.0.1:{port}/health", READY_SECONDS)
        yield f"http://127.0.0.1:{port}"
    finally:
        await proc.stop()


async def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["2025-11-25", "2026-07-28"])
async def test_past_its_budget_a_session_is_not_asked_and_status_lists_the_question(
    rt: RuntimeStack, mode: str
) -> None:
    asked: list[str] = []
    async with (
        runtime(rt, f"budget-{mode}", "--approvals-per-hour", "1") as base,
        asyncio.timeout(40),
        Client(f"{base}/mcp", mode=mode, elicitation_callback=answering(True, asked)) as c,
    ):
        handles = [(await call(c, "spawn", TIDY))["handle"] for _ in range(2)]
        for handle in handles:
            await wait_state(c, handle, "AwaitingApproval")
        waited = await call(c, "await", {"handles": handles, "timeout": 3})
        status = await call(c, "status", {"handles": handles})
        [held] = status["questions"]
        answer = await call(c, "approve", {"handle": held["handle"], "allow": False})
        done = await call(c, "await", {"handles": handles, "timeout": 20})
        _, tree = await http("GET", f"{base}/status")
        async with aiohttp.ClientSession() as s, s.get(f"{base}/metrics") as resp:
            metrics = await resp.text()
    assert len(asked) == 1 and held["handle"] not in asked[0]
    assert sorted(r["state"] for r in waited["runs"]) == ["AwaitingApproval", "finished"]
    assert held["tool"] == "delete_record" and "record_id" in held["arguments"]
    assert held["since"] > 0 and held["waitingSeconds"] >= 0
    assert status["attention"]["askedLastHour"] == 1 and status["attention"]["mayAsk"] is False
    assert answer["allow"] is False
    assert [r["state"] for r in done["runs"]] == ["finished", "finished"]
    assert tree["questions"] == [] and tree["away"]["perHour"] == 1
    assert "luftpause_runtime_approval_questions_total 1.0" in metrics


async def test_away_holds_every_question_of_its_session_until_switched_off(
    rt: RuntimeStack,
) -> None:
    asked: list[str] = []
    async with (
        asyncio.timeout(40),
        Client(rt.mcp_url, elicitation_callback=answering(True, asked)) as c,
    ):
        away = await call(c, "away", {"on": True})
        handle = (await call(c, "spawn", TIDY))["handle"]
        await wait_state(c, handle, "AwaitingApproval")
        held = await call(c, "await", {"handles": [handle], "timeout": 1})
        status = await call(c, "status", {"handles": [handle]})
        assert asked == []
        waited = asyncio.create_task(c.call_tool("await", {"handles": [handle], "timeout": 20}))
        back = await call(c, "away", {"on": False})
        result = await waited
    assert away["away"] is True and back["away"] is False
    assert held["runs"][0]["state"] == "AwaitingApproval"
    assert [q["handle"] for q in status["questions"]] == [handle]
    assert status["attention"]["away"] is True
    assert len(asked) == 1 and handle in asked[0]
    assert result.structured_content is not None
    assert result.structured_content["runs"][0]["state"] == "finished"


async def test_a_script_switches_everyone_away_over_http_and_back(rt: RuntimeStack) -> None:
    base = f"http://127.0.0.1:{rt.runtime_port}"
    asked: list[str] = []
    try:
        status, switched = await http("POST", f"{base}/away", {"on": True})
        assert status == 200 and switched["everyone"] is True
        async with (
            asyncio.timeout(40),
            Client(rt.mcp_url, elicitation_callback=answering(True, asked)) as c,
        ):
            handle = (await call(c, "spawn", TIDY))["handle"]
            await wait_state(c, handle, "AwaitingApproval")
            held = await call(c, "await", {"handles": [handle], "timeout": 1})
            view = (await call(c, "status", {"handles": [handle]}))["attention"]
            assert asked == [] and view["awayEveryone"] is True
            waited = asyncio.create_task(c.call_tool("await", {"handles": [handle], "timeout": 20}))
            status, back = await http("POST", f"{base}/away", {"on": False})
            result = await waited
    finally:
        await http("POST", f"{base}/away", {"on": False})
    assert status == 200 and back["everyone"] is False
    assert held["runs"][0]["state"] == "AwaitingApproval" and len(asked) == 1
    assert result.structured_content is not None
    assert result.structured_content["runs"][0]["state"] == "finished"
    assert (await http("GET", f"{base}/away"))[1]["everyone"] is False


@pytest.mark.parametrize("body", [None, {"on": "yes"}, {"on": True, "session": 7}, [True]], ids=str)
async def test_the_away_route_refuses_a_body_that_does_not_fit(rt: RuntimeStack, body: Any) -> None:
    status, answer = await http("POST", f"http://127.0.0.1:{rt.runtime_port}/away", body)
    assert status == 400 and (
        '"on"' in answer["error"]["message"] or "session" in answer["error"]["message"]
    )


async def test_away_with_a_bad_argument_is_a_clear_tool_error(rt: RuntimeStack) -> None:
    async with asyncio.timeout(20), Client(rt.mcp_url) as c:
        bad = await c.call_tool("away", {"on": "maybe"})
        missing = await c.call_tool("away", {})
    assert bad.is_error and "on" in str(bad.content) and "bool" in str(bad.content)
    assert missing.is_error and "Field required" in str(missing.content)


async def test_with_a_budget_of_zero_a_task_is_never_asked_and_approve_answers(
    rt: RuntimeStack,
) -> None:
    tasks = Tasks(allow=True)
    async with (
        runtime(rt, "budget-zero", "--approvals-per-hour", "0") as base,
        asyncio.timeout(40),
        Client(f"{base}/mcp", extensions=[tasks]) as c,
        Client(f"{base}/mcp") as operator,
    ):
        ran = asyncio.create_task(c.call_tool("run", TIDY))
        while not (questions := (await call(operator, "status", {}))["questions"]):
            await asyncio.sleep(0.05)
        await call(operator, "approve", {"handle": questions[0]["handle"], "allow": True})
        result = await ran
    assert result.structured_content is not None
    assert result.structured_content["state"] == "finished"
    assert "input_required" not in [t["status"] for t in tasks.seen]


async def test_an_answer_journaled_before_a_restart_is_never_asked_again(
    rt: RuntimeStack,
) -> None:
    asked: list[str] = []
    args = {"task": "t", "tools": ["deep_search"], "maxToolCalls": 1}
    args["approveTools"] = ["deep_search"]
    async with (
        runtime(rt, "answered") as base,
        asyncio.timeout(30),
        Client(f"{base}/mcp", elicitation_callback=answering(True, asked)) as c,
    ):
        handle = (await call(c, "spawn", args))["handle"]
        await wait_state(c, handle, "AwaitingApproval")
        await call(c, "await", {"handles": [handle], "timeout": 1})  # asked, allowed
        await wait_state(c, handle, "tools")  # deep_search runs (3 s): the answer is on disk
    async with (
        runtime(rt, "answered") as base,  # the same state dir: a restart
        asyncio.timeout(30),
        Client(f"{base}/mcp", elicitation_callback=answering(True, asked)) as c,
    ):
        [out] = (await call(c, "await", {"handles": [handle], "timeout": 20}))["runs"]
    assert len(asked) == 1 and out["state"] == "finished" and out["failedToolCalls"] == 0
    kinds = [r["type"] for r in journal(rt, "answered") if r["run"] == handle]
    assert kinds.count("approval") == 1 and kinds.count("finished") == 1
