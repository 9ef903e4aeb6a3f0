"""Tracing end to end: scheduler, dataplane and runtime as real processes exporting over
OTLP/gRPC to a receiver in this process; simulated engines and fake-mcp; a sub-agent spawned
with the official `mcp` client over Streamable HTTP.

One spawned sub-agent with two tool rounds is one trace: the runtime's `invoke_agent` span, a
`chat` span per model turn below it and, below each, the dataplane's span of that turn and the
scheduler's `admit` span below that; an `execute_tool` span per tool call below the run (and the
mcp client's own span below each). An MCP request that carries a `traceparent` header puts the
whole sub-agent inside the caller's trace.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from luftpause.testkit.stack import SIM_MODEL, LocalStack, RuntimeStack, start_runtime
from tests.integration.otlp import Collector, Received, start_collector

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOOL_ROUNDS = 2  # the simulated model calls lookup twice, then answers: three turns
ENGINE_ARGS = ("--time-scale", "20", "--tool-rounds", str(TOOL_ROUNDS))
WAIT = 30.0


@dataclass
class Traced:
    stack: LocalStack
    runtime: RuntimeStack
    collector: Collector
    workdir: Path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def traced(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Traced]:
    workdir: Path = tmp_path_factory.mktemp("tracing")
    server, port, collector = await start_collector()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    try:
        async with AsyncExitStack() as exits:
            with pytest.MonkeyPatch.context() as mp:  # the children copy it when they start
                for name, value in env.items():
                    mp.setenv(name, value)
                stack = await LocalStack(workdir, engine_args=ENGINE_ARGS).start(exits)
                runtime = await start_runtime(
                    exits, workdir, f"http://127.0.0.1:{stack.dataplane_port}"
                )
            await stack.wait_healthy()
            yield Traced(stack=stack, runtime=runtime, collector=collector, workdir=workdir)
    finally:
        await server.stop(grace=None)


async def spawn_and_finish(client: Client, task: str) -> str:
    spawned = await client.call_tool("spawn", {"task": task, "tools": ["lookup"]})
    assert spawned.structured_content is not None, spawned.content
    handle = str(spawned.structured_content["handle"])
    done = await client.call_tool("await", {"handles": [handle], "timeout": 25})
    assert done.structured_content is not None, done.content
    [run] = done.structured_content["runs"]
    assert run["state"] == "finished" and run["toolCalls"] == TOOL_ROUNDS, run
    return handle


def run_spans(handle: str) -> Callable[[list[Received]], bool]:
    """Whether the run's trace has arrived whole: its run span, and three turns through all
    three services."""

    def whole(spans: list[Received]) -> bool:
        agent = [s for s in spans if s.attributes.get("gen_ai.agent.id") == handle]
        if not agent:
            return False
        trace = [s for s in spans if s.trace_id == agent[0].trace_id]
        by_service = [s.service for s in trace]
        return all(by_service.count(f"luftpause-{n}") >= 3 for n in ("scheduler", "dataplane"))

    return whole


def of_trace(spans: list[Received], handle: str) -> tuple[Received, list[Received]]:
    [agent] = [s for s in spans if s.attributes.get("gen_ai.agent.id") == handle]
    return agent, [s for s in spans if s.trace_id == agent.trace_id]


def children(spans: list[Received], parent: Received, name: str = "") -> list[Received]:
    return [s for s in spans if s.parent_id == parent.span_id and s.name.startswith(name)]


async def engine_traceparents(stack: LocalStack) -> list[str]:
    found = []
    async with aiohttp.ClientSession() as http:
        for i in range(len(stack.engine_ports)):
            async with http.get(stack.engine_url(i) + "/debug/requests") as resp:
                requests = (await resp.json())["requests"]
            found += [r["headers"].get("traceparent", "") for r in requests]
    return found


async def test_a_spawned_sub_agent_is_one_trace_through_runtime_dataplane_and_scheduler(
    traced: Traced,
) -> None:
    async with asyncio.timeout(WAIT):
        async with Client(traced.runtime.mcp_url) as client:
            handle = await spawn_and_finish(client, "rivers of the north")
        spans = await traced.collector.until(run_spans(handle))
    agent, trace = of_trace(spans, handle)

    # The run: a root, in the runtime, by the GenAI conventions.
    assert agent.service == "luftpause-runtime" and agent.parent_id == ""
    assert agent.name == "invoke_agent luftpause-subagent" and agent.kind == "internal"
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.request.model"] == SIM_MODEL
    assert agent.attributes["luftpause.run.state"] == "finished"
    assert agent.attributes["luftpause.tool_calls"] == TOOL_ROUNDS

    # A chat span per model turn, each with the reply's usage and finish reason.
    chats = children(trace, agent, "chat ")
    assert len(chats) == TOOL_ROUNDS + 1
    for chat in chats:
        assert chat.name == f"chat {SIM_MODEL}" and chat.kind == "client"
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert chat.attributes["gen_ai.usage.output_tokens"] > 0
        assert "gen_ai.usage.cache_read.input_tokens" in chat.attributes
    reasons = sorted(c.attributes["gen_ai.response.finish_reasons"] for c in chats)
    assert reasons == [("stop",), ("tool_calls",), ("tool_calls",)]
    assert max(c.attributes["gen_ai.usage.cache_read.input_tokens"] for c in chats) > 0

    # Below each chat span, the dataplane's span of that turn; below that, the scheduler's.
    proxied = []
    for chat in chats:
        [turn] = children(trace, chat)
        assert turn.service == "luftpause-dataplane" and turn.kind == "server"
        assert turn.name == f"chat {SIM_MODEL}"
        assert turn.attributes["luftpause.run_id"] == handle
        assert turn.attributes["luftpause.service_class"] == "interactive"
        assert turn.attributes["luftpause.caller"]
        assert turn.attributes["luftpause.ttfb_ms"] > 0
        assert turn.attributes["luftpause.held_ms"] >= 0
        for name in ("gen_ai.usage.input_tokens", "gen_ai.response.finish_reasons"):
            assert turn.attributes[name] == chat.attributes[name]
        assert turn.events == ("started", "finished")
        [admit] = children(trace, turn)
        assert admit.service == "luftpause-scheduler" and admit.name == "admit"
        assert admit.kind == "server"
        assert admit.attributes["luftpause.replica"] == turn.attributes["luftpause.replica"]
        assert admit.attributes["luftpause.turn_id"] == turn.attributes["luftpause.turn_id"]
        assert admit.attributes["luftpause.placed_by"] == turn.attributes["luftpause.placed_by"]
        assert "luftpause.held_ms" in admit.attributes
        proxied.append(turn)
    # The first turn of a run is placed by the scheduler; the dataplane places the rest itself
    # on the open replica that holds the run.
    assert {t.attributes["luftpause.placed_by"] for t in proxied} >= {"scheduler"}

    # The engines got each turn's traceparent: the dataplane's span is its parent.
    sent = {tp.rsplit("-", 1)[0] for tp in await engine_traceparents(traced.stack)}
    for turn in proxied:
        assert f"00-{turn.trace_id}-{turn.span_id}" in sent

    # A span per tool call below the run; the mcp client's request below each.
    tools = children(trace, agent, "execute_tool ")
    assert [t.name for t in tools] == ["execute_tool lookup"] * TOOL_ROUNDS
    for tool in tools:
        assert tool.kind == "internal"
        assert tool.attributes["gen_ai.tool.name"] == "lookup"
        assert tool.attributes["gen_ai.tool.call.id"]
        assert [s.name for s in children(trace, tool)] == ["MCP send tools/call lookup"]
    assert {s.kind for s in trace} == {"internal", "client", "server"}
    assert {s.service for s in trace} == {
        "luftpause-runtime",
        "luftpause-dataplane",
        "luftpause-scheduler",
    }

    # The run's log lines carry its trace id.
    lines = (traced.workdir / "runtime.log").read_text().splitlines()
    logged = [json.loads(line) for line in lines if line.startswith("{")]
    over = [e for e in logged if e.get("event") == "run.over" and e.get("run") == handle]
    assert [e.get("trace_id") for e in over] == [agent.trace_id]


async def test_an_mcp_request_with_a_traceparent_puts_the_sub_agent_in_the_callers_trace(
    traced: Traced,
) -> None:
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {"traceparent": f"00-{caller_trace}-{caller_span}-01"}
    async with asyncio.timeout(WAIT):
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
            transport = streamable_http_client(traced.runtime.mcp_url, http_client=http)
            async with Client(transport) as client:
                handle = await spawn_and_finish(client, "rivers of the south")
        spans = await traced.collector.until(run_spans(handle))
    agent, trace = of_trace(spans, handle)
    assert agent.trace_id == caller_trace
    assert agent.parent_id == caller_span
    assert len(children(trace, agent, "chat ")) == TOOL_ROUNDS + 1
    assert {s.service for s in trace} >= {
        "luftpause-runtime",
        "luftpause-dataplane",
        "luftpause-scheduler",
    }
    # The mcp SDK's own server span of the spawn call is in the caller's trace too.
    spawn_calls = [s for s in trace if s.name == "tools/call spawn"]
    assert spawn_calls and all(s.parent_id == caller_span for s in spawn_calls)
