"""The runtime's spans, in process: a run's `invoke_agent` span and where it hangs, its tool
calls' `execute_tool` spans, its journaled trace context, and the span of a resumed run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from mcp.types import CallToolResult, TextContent, Tool
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanKind

from luftpause.common import tracing
from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.resend import Outcome
from luftpause.runtime.journal.file import JournalFile
from luftpause.runtime.loop.llm import Llm
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.loop.upstream import Attempt, Upstreams, UpstreamTool

TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE:032x}-{CALLER:016x}-01"
CALL = m.ToolCall(id="c1", name="lookup", arguments="{}")


class OneToolRound:
    """A model that calls `lookup` once, then answers; a run whose task is "hang" never ends."""

    def __init__(self) -> None:
        self.hang = asyncio.Event()
        self.hanging = asyncio.Event()

    async def turn(
        self, spec: m.RunSpec, messages: tuple[dict[str, Any], ...], tools: Any, **_: Any
    ) -> m.TurnCompleted:
        if spec.task == "hang":
            self.hanging.set()
            await self.hang.wait()
        if any(msg.get("role") == "tool" for msg in messages):
            return m.TurnCompleted(content="done", usage=m.Usage(turns=1, prompt_tokens=7))
        return m.TurnCompleted(content=None, tool_calls=(CALL,), usage=m.Usage(turns=1))

    async def forget_run(self, handle: str) -> None:
        pass


class Lookup:
    async def catalogue(self) -> dict[str, UpstreamTool]:
        tool = Tool(name="lookup", input_schema={"type": "object", "properties": {}})
        return {"lookup": UpstreamTool(server="memory", tool=tool)}

    async def attempt(self, tool: UpstreamTool, name: str, *_: Any) -> Attempt:
        result = CallToolResult(content=[TextContent(text="found")])
        return Attempt(outcome=Outcome.ANSWERED, result=result)


def runtime(state_dir: Path) -> Runtime:
    rt = Runtime(JournalFile(state_dir), cast(Llm, OneToolRound()), cast(Upstreams, Lookup()))
    rt.resume()
    return rt


def spec(handle: str, task: str = "t", parent: str | None = None) -> m.RunSpec:
    return m.RunSpec(handle=handle, task=task, model="sim", parent=parent)


def named(exported: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exported.get_finished_spans() if s.name.startswith(prefix)]


def test_a_spec_keeps_its_traceparent_through_the_journal_and_omits_it_when_untraced() -> None:
    traced = m.RunSpec(handle="run-1", task="x", model="sim", traceparent=TRACEPARENT)
    record = j.spawned_record(traced)
    assert record["spec"]["traceparent"] == TRACEPARENT
    assert m.RunSpec.from_json(record["spec"]) == traced
    plain = j.spawned_record(spec("run-2"))
    assert "traceparent" not in plain["spec"]  # format 1 as before: golden journals unchanged
    assert m.RunSpec.from_json(plain["spec"]).traceparent is None


async def test_a_run_is_an_invoke_agent_span_under_its_caller_with_its_tool_calls_below(
    tmp_path: Path, exported: InMemorySpanExporter
) -> None:
    rt = runtime(tmp_path)
    try:
        async with asyncio.timeout(5):
            handle = await rt.spawn(spec("run-a"), caller_trace=TRACEPARENT)
            await rt.await_runs([handle], "all", 5)
            child = await rt.spawn(spec("run-b", parent=handle))
            await rt.await_runs([child], "all", 5)
    finally:
        await rt.stop()
    agents = {s.attributes["gen_ai.agent.id"]: s for s in named(exported, "invoke_agent")}  # type: ignore[index]
    run_a, run_b = agents["run-a"], agents["run-b"]
    assert run_a.name == "invoke_agent luftpause-subagent" and run_a.kind is SpanKind.INTERNAL
    assert run_a.context is not None and run_a.context.trace_id == TRACE
    assert run_a.parent is not None and run_a.parent.span_id == CALLER
    assert run_b.parent is not None and run_b.parent.span_id == run_a.context.span_id
    got = dict(run_a.attributes or {})
    assert got["gen_ai.operation.name"] == "invoke_agent"
    assert got["luftpause.run.state"] == "finished" and got["luftpause.tool_calls"] == 1
    assert got["gen_ai.usage.input_tokens"] == 7
    tools = [s for s in named(exported, "execute_tool") if s.parent == run_a.context]
    assert [s.name for s in tools] == ["execute_tool lookup"]
    assert dict(tools[0].attributes or {})["gen_ai.tool.call.id"] == "c1"
    spawned = [r for r in JournalFile(tmp_path).open() if r["type"] == "spawned"]
    assert spawned[0]["spec"]["traceparent"] == tracing.traceparent_of(_span_of(run_a))


async def test_a_run_without_a_caller_trace_is_a_root_span(
    tmp_path: Path, exported: InMemorySpanExporter
) -> None:
    rt = runtime(tmp_path)
    try:
        with tracing.tracer("test").start_as_current_span("ambient"):  # the MCP request's span
            handle = await rt.spawn(spec("run-a"))
        await rt.await_runs([handle], "all", 5)
    finally:
        await rt.stop()
    [run] = named(exported, "invoke_agent")
    assert run.parent is None


async def test_a_resumed_run_gets_a_new_root_span_linked_to_its_journaled_one(
    tmp_path: Path, exported: InMemorySpanExporter
) -> None:
    rt = runtime(tmp_path)
    await rt.spawn(spec("run-h", task="hang"), caller_trace=TRACEPARENT)
    async with asyncio.timeout(5):
        await cast(OneToolRound, rt.llm).hanging.wait()
    await rt.stop()  # the runtime stops mid-run: the span ends, interrupted
    [first] = named(exported, "invoke_agent")
    assert dict(first.attributes or {})["luftpause.interrupted"] is True
    rt = runtime(tmp_path)
    await rt.stop()
    resumed = [s for s in named(exported, "invoke_agent") if s is not first]
    [again] = resumed
    assert again.parent is None and dict(again.attributes or {})["luftpause.resumed"] is True
    assert [link.context for link in again.links] == [_remote(first)]


def _span_of(span: ReadableSpan) -> Any:
    assert span.context is not None
    return NonRecordingSpan(span.context)


def _remote(span: ReadableSpan) -> Any:
    return tracing.span_context_of(tracing.traceparent_of(_span_of(span)))
