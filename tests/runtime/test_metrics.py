"""The runtime's metrics move when runs spawn, call tools, wait for approval, trip budgets and
end: an in-process `Runtime` with a scripted model and in-memory tools (no sockets), and its
GET /metrics route driven through ASGI.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from luftpause.runtime.core import machine as m
from luftpause.runtime.core.resend import Outcome
from luftpause.runtime.journal.file import JournalFile
from luftpause.runtime.loop.llm import Llm
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.loop.upstream import Attempt, Upstreams, UpstreamTool
from luftpause.runtime.server.app import build_server
from luftpause.runtime.server.auth import BearerAuth
from luftpause.runtime.server.cors import StatusCors
from luftpause.runtime.server.metrics import UNKNOWN_TOOL, RuntimeMetrics

WAIT = 5.0


def call(call_id: str, name: str) -> m.ToolCall:
    return m.ToolCall(id=call_id, name=name, arguments="{}")


class ScriptedModel:
    """Answers each run's turns from a script keyed by the run's task: the n-th turn of a run
    gets the n-th reply (the last one again once the script is spent)."""

    def __init__(self, script: dict[str, list[m.TurnCompleted]]) -> None:
        self.script = script

    async def turn(
        self,
        spec: m.RunSpec,
        messages: tuple[dict[str, Any], ...],
        tools: list[dict[str, Any]],
        *,
        calls: bool = True,
    ) -> m.TurnCompleted:
        replies = self.script[spec.task]
        done = sum(1 for msg in messages if msg.get("role") == "assistant")
        return replies[min(done, len(replies) - 1)]

    async def forget_run(self, handle: str) -> None:
        pass


class MemoryTools:
    """Upstream tools in memory: `lookup` answers, `flaky` fails, `wipe` is destructive."""

    def __init__(self) -> None:
        def tool(name: str, destructive: bool = False) -> UpstreamTool:
            annotations = ToolAnnotations(destructive_hint=True) if destructive else None
            schema = {"type": "object", "properties": {}}
            return UpstreamTool(
                server="memory",
                tool=Tool(name=name, input_schema=schema, annotations=annotations),
            )

        self.tools = {t.tool.name: t for t in (tool("lookup"), tool("flaky"), tool("wipe", True))}

    async def catalogue(self) -> dict[str, UpstreamTool]:
        return self.tools

    async def attempt(
        self, tool: UpstreamTool, name: str, arguments: dict[str, Any], key: str, deadline: float
    ) -> Attempt:
        result = CallToolResult(content=[TextContent(text="result")], is_error=name == "flaky")
        return Attempt(outcome=Outcome.ANSWERED, result=result)


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    metrics = RuntimeMetrics()
    script = {
        "work": [
            m.TurnCompleted(
                content=None,
                tool_calls=(call("c1", "lookup"), call("c2", "flaky"), call("c3", "invented")),
            ),
            m.TurnCompleted(content="done"),
        ],
        "careful": [
            m.TurnCompleted(content=None, tool_calls=(call("w1", "wipe"),)),
            m.TurnCompleted(content="wiped"),
        ],
        "loop": [m.TurnCompleted(content=None, tool_calls=(call("l1", "lookup"),))],
    }
    journal = JournalFile(tmp_path, observe=metrics.journal_append.observe)
    rt = Runtime(
        journal,
        cast(Llm, ScriptedModel(script)),
        cast(Upstreams, MemoryTools()),
        metrics=metrics,
    )
    rt.resume()
    try:
        yield rt
    finally:
        await rt.stop()


def spec(task: str, **extra: Any) -> m.RunSpec:
    return m.RunSpec(
        handle=f"run-{task}", task=task, model="sim", parallel_tool_calls=True, **extra
    )


def sample(rt: Runtime, name: str, **labels: str) -> float:
    value = rt.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def finish(rt: Runtime, handle: str) -> dict[str, Any]:
    (summary,) = await rt.await_runs([handle], "all", WAIT)
    assert summary["state"] in ("finished", "failed", "cancelled"), summary
    return summary


async def test_a_run_counts_its_spawn_its_tool_calls_by_tool_and_its_end(
    runtime: Runtime,
) -> None:
    handle = await runtime.spawn(spec("work", service_class="batch"))
    assert (await finish(runtime, handle))["state"] == "finished"

    assert sample(runtime, "luftpause_runtime_runs_spawned_total", service_class="batch") == 1
    finished = {"service_class": "batch", "outcome": "finished"}
    assert sample(runtime, "luftpause_runtime_runs_finished_total", **finished) == 1
    calls = "luftpause_runtime_tool_calls_total"
    failures = "luftpause_runtime_tool_call_failures_total"
    assert sample(runtime, calls, tool="lookup") == 1
    assert sample(runtime, failures, tool="lookup") == 0
    assert sample(runtime, calls, tool="flaky") == sample(runtime, failures, tool="flaky") == 1
    # A name the model made up counts under one label, not under its own.
    assert sample(runtime, calls, tool=UNKNOWN_TOOL) == 1
    assert sample(runtime, calls, tool="invented") == 0
    assert sample(runtime, "luftpause_runtime_runs", state="finished", service_class="batch") == 1
    assert sample(runtime, "luftpause_runtime_runs", state="running", service_class="batch") == 0


async def test_every_journal_append_is_timed(runtime: Runtime) -> None:
    handle = await runtime.spawn(spec("work"))
    await finish(runtime, handle)
    # spawned; the turn with lookup's send (one line), flaky's send, the invented tool's result,
    # one of the others' results, the round with the last; finished
    assert sample(runtime, "luftpause_runtime_journal_append_seconds_count") == 7
    assert sample(runtime, "luftpause_runtime_journal_append_seconds_sum") > 0


async def test_a_call_waiting_for_approval_shows_until_answered(runtime: Runtime) -> None:
    with runtime.approvals.watch() as asked:
        handle = await runtime.spawn(spec("careful"))
        async with asyncio.timeout(WAIT):
            await asked.wait()
    assert sample(runtime, "luftpause_runtime_approvals_waiting") == 1
    waiting = {"state": "AwaitingApproval", "service_class": "interactive"}
    assert sample(runtime, "luftpause_runtime_runs", **waiting) == 1

    await runtime.approve(handle, allow=False)
    await finish(runtime, handle)
    assert sample(runtime, "luftpause_runtime_approvals_waiting") == 0
    # The declined call is a tool call whose result is an error.
    assert sample(runtime, "luftpause_runtime_tool_calls_total", tool="wipe") == 1
    assert sample(runtime, "luftpause_runtime_tool_call_failures_total", tool="wipe") == 1


async def test_a_budget_trip_is_counted_by_kind_and_its_run_ends_cancelled(
    runtime: Runtime,
) -> None:
    handle = await runtime.spawn(spec("loop", budget_tool_calls=1))
    summary = await finish(runtime, handle)
    assert summary["state"] == "cancelled"
    assert sample(runtime, "luftpause_runtime_budget_trips_total", kind="toolCalls") == 1
    assert sample(runtime, "luftpause_runtime_budget_trips_total", kind="tokens") == 0
    cancelled = {"service_class": "interactive", "outcome": "cancelled"}
    assert sample(runtime, "luftpause_runtime_runs_finished_total", **cancelled) == 1


async def test_metrics_route_serves_prometheus_text_without_the_token(runtime: Runtime) -> None:
    handle = await runtime.spawn(spec("work"))
    await finish(runtime, handle)
    server = build_server(runtime, default_model="sim")
    app = StatusCors(BearerAuth(server.streamable_http_app(streamable_http_path="/mcp"), b"s3cret"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://runtime") as client:
        resp = await client.get("/metrics")
        status = await client.get("/status")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    assert 'luftpause_runtime_tool_calls_total{tool="lookup"} 1.0' in resp.text
    assert "luftpause_runtime_journal_append_seconds_bucket" in resp.text
    assert status.status_code == 401  # the run tree still needs the token
