"""The MCP Tasks extension (io.modelcontextprotocol/tasks) end to end: the official `mcp` client
opts in with a client extension whose result claim polls tasks/get and answers input_required
with tasks/update; the runtime is `test_runtime`'s stack.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp.types import CallToolResult, Request, RequestParams, Result
from pydantic import TypeAdapter

from luftpause.testkit.procs import free_port
from tests.integration.test_runtime import RuntimeStack, rt

pytestmark = pytest.mark.asyncio(loop_scope="module")
__all__ = ["rt"]

ANY = TypeAdapter(dict[str, Any])


class TaskId(RequestParams):
    task_id: str


class Answers(RequestParams):
    task_id: str
    input_responses: dict[str, Any]


class GetTask(Request[TaskId, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskId


class UpdateTask(Request[Answers, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: Answers


class TaskHandle(Result):
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class Stop(Exception):
    """The test's resolver gives up on purpose (the runtime is about to be killed)."""


class Tasks(ClientExtension):
    """Opts into tasks; resolves a task by polling, answering approvals with `allow`."""

    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self, allow: bool | None) -> None:
        self.allow = allow
        self.seen: list[dict[str, Any]] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
        while True:
            task = await get_task(ctx.session, handle.task_id)
            self.seen.append(task)
            if task["status"] == "completed":
                return CallToolResult.model_validate(task["result"])
            if task["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"task {task['status']}: {task}")
            if task["status"] == "input_required":
                if self.allow is None:
                    raise Stop(handle.task_id)
                answer = {"action": "accept", "content": {"allow": self.allow}}
                responses = {key: answer for key in task["inputRequests"]}
                params = Answers(task_id=handle.task_id, input_responses=responses)
                await ctx.session.send_request(UpdateTask(params=params), ANY)  # type: ignore[type-var]
            await asyncio.sleep(task["pollIntervalMs"] / 1000)


async def get_task(session: ClientSession, task_id: str) -> dict[str, Any]:
    request = GetTask(params=TaskId(task_id=task_id))
    return await session.send_request(request, ANY)  # type: ignore[type-var]


async def test_a_client_that_opts_in_gets_a_task_answers_its_approval_and_reads_the_result(
    rt: RuntimeStack,
) -> None:
    tasks = Tasks(allow=True)
    before = (await rt.tool_calls())["delete_record"]
    args = {"task": "tidy", "tools": ["delete_record"], "maxToolCalls": 1}
    async with asyncio.timeout(30), Client(rt.mcp_url, extensions=[tasks]) as c:
        result = await c.call_tool("run", args)
    assert not result.is_error and result.structured_content is not None
    out = result.structured_content
    assert out["state"] == "finished" and out["toolCalls"] == 1 and out["failedToolCalls"] == 0
    statuses = [t["status"] for t in tasks.seen]
    assert "input_required" in statuses and statuses[-1] == "completed"
    [asked] = [t for t in tasks.seen if t["status"] == "input_required"][:1]
    [request] = asked["inputRequests"].values()
    assert request["method"] == "elicitation/create" and "delete_record" in json.dumps(request)
    assert (await rt.tool_calls())["delete_record"] == before + 1
    records = (rt.workdir / "state" / "tasks.jsonl").read_text().splitlines()
    assert any(json.loads(r)["run"] == out["handle"] for r in records if '"task"' in r)


async def test_a_client_that_does_not_opt_in_gets_run_as_one_blocking_call(
    rt: RuntimeStack,
) -> None:
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        result = await c.call_tool("run", {"task": "plain", "maxToolCalls": 0})
    assert result.structured_content is not None
    assert result.structured_content["state"] == "finished"


async def test_a_task_open_at_shutdown_is_failed_on_restart_while_its_run_resumes(
    rt: RuntimeStack,
) -> None:
    port = free_port()
    state_dir = rt.workdir / "tasks-state"
    url = f"http://127.0.0.1:{port}/mcp"
    proc = await rt.start_runtime(port, state_dir, "runtime-tasks")
    args = {"task": "t", "tools": ["lookup"], "maxToolCalls": 1, "approveTools": ["lookup"]}
    try:
        async with asyncio.timeout(40):
            with pytest.raises(Exception) as stopped:  # an ExceptionGroup around Stop
                async with Client(url, extensions=[Tasks(allow=None)]) as c:
                    await c.call_tool("run", args)
            stop = _stop_of(stopped.value)
            assert stop is not None, f"the resolver did not stop: {stopped.value!r}"
            task_id = stop.args[0]
            await proc.kill()
            proc = await rt.start_runtime(port, state_dir, "runtime-tasks")
            async with Client(url, extensions=[Tasks(allow=True)]) as c:
                task = await get_task(c.session, task_id)
                [run] = [
                    json.loads(line)["run"]
                    for line in (state_dir / "tasks.jsonl").read_text().splitlines()
                    if json.loads(line)["type"] == "task"
                ]
                await c.call_tool("approve", {"handle": run, "allow": True})
                out = await c.call_tool("await", {"handles": [run], "timeout": 20})
    finally:
        await proc.stop()
    assert task["status"] == "failed" and "restarted" in task["error"]["message"]
    assert out.structured_content is not None
    [resumed] = out.structured_content["runs"]
    assert resumed["state"] == "finished" and resumed["toolCalls"] == 1


def _stop_of(exc: BaseException) -> Stop | None:
    """The resolver's Stop inside whatever the client wrapped it in."""
    if isinstance(exc, Stop):
        return exc
    inner = list(exc.exceptions) if isinstance(exc, BaseExceptionGroup) else []
    inner += [e for e in (exc.__cause__, exc.__context__) if e is not None]
    return next((s for e in inner if (s := _stop_of(e)) is not None), None)
