"""The dataplane's turn span: off, nothing is built; on, a SERVER span per turn in the caller's
trace, whose traceparent goes on to the scheduler and the engine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer, ProxyTracer, ProxyTracerProvider, SpanKind

from luftpause.common import tracing
from tests.dataplane.conftest import Stack, running_stack
from tests.dataplane.fakes import MODEL

CLIENT_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CLIENT_SPAN = 0xB7AD6B7169203331
TRACEPARENT = f"00-{CLIENT_TRACE:032x}-{CLIENT_SPAN:016x}-01"


@pytest.fixture
async def traced_stack(exported: InMemorySpanExporter) -> AsyncIterator[Stack]:
    async with running_stack() as s:  # the app is built while tracing is on
        yield s


def only_span(exported: InMemorySpanExporter) -> ReadableSpan:
    [span] = exported.get_finished_spans()
    return span


async def test_with_tracing_off_the_proxy_path_starts_no_span_and_passes_the_clients_trace_on(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        started.append(str(args[1] if len(args) > 1 else kwargs.get("name")))
        raise AssertionError("a span was started with tracing off")

    for cls in (NoOpTracer, ProxyTracer):
        monkeypatch.setattr(cls, "start_span", counting)
        monkeypatch.setattr(cls, "start_as_current_span", counting)
    assert not tracing.enabled()
    assert isinstance(trace.get_tracer_provider(), ProxyTracerProvider)
    status, _, _ = await stack.post(stack.chat(stream=True), traceparent=TRACEPARENT)
    assert status == 200 and started == []
    assert stack.engine.seen[-1].headers["traceparent"] == TRACEPARENT  # passed on unchanged
    assert stack.scheduler.admits[-1].traceparent == ""


async def test_a_traced_turn_is_a_server_span_in_the_callers_trace_with_its_genai_attributes(
    traced_stack: Stack, exported: InMemorySpanExporter
) -> None:
    status, headers, _ = await traced_stack.post(
        traced_stack.chat(stream=True),
        traceparent=TRACEPARENT,
        **{"x-luftpause-run-id": "run-1", "x-luftpause-caller": "alice"},
    )
    assert status == 200
    span = only_span(exported)
    assert span.name == f"chat {MODEL}" and span.kind is SpanKind.SERVER
    assert span.context is not None and span.context.trace_id == CLIENT_TRACE
    assert span.parent is not None and span.parent.span_id == CLIENT_SPAN
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == MODEL
    assert attributes["luftpause.run_id"] == "run-1" == headers["x-luftpause-run-id"]
    assert attributes["luftpause.caller"] == "alice"
    assert attributes["luftpause.service_class"] == "interactive"
    assert attributes["luftpause.replica"] == "engine-a"
    assert attributes["luftpause.placed_by"] == "scheduler"
    assert attributes["luftpause.held_ms"] == 0.0
    ttfb_ms = attributes["luftpause.ttfb_ms"]
    assert isinstance(ttfb_ms, float) and ttfb_ms > 0
    # The fake engine's stream: 12 prompt tokens (8 cached), 2 out, stopped.
    assert attributes["gen_ai.usage.input_tokens"] == 12
    assert attributes["gen_ai.usage.output_tokens"] == 2
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 8
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["http.response.status_code"] == 200
    assert [e.name for e in span.events] == ["started", "first_token", "finished"]
    ours = tracing.traceparent_of(trace.NonRecordingSpan(span.context))
    assert traced_stack.scheduler.admits[-1].traceparent == ours
    assert traced_stack.engine.seen[-1].headers["traceparent"] == ours


async def test_a_turn_without_a_traceparent_is_a_root_span(
    traced_stack: Stack, exported: InMemorySpanExporter
) -> None:
    status, _, _ = await traced_stack.post(traced_stack.chat())
    assert status == 200
    span = only_span(exported)
    assert span.parent is None
    assert "traceparent" in traced_stack.engine.seen[-1].headers


async def test_a_refused_turn_ends_its_span_with_the_status(
    traced_stack: Stack, exported: InMemorySpanExporter
) -> None:
    status, _, body = await traced_stack.post(traced_stack.chat(model="nope"))
    assert status == 404, body
    span = only_span(exported)
    assert dict(span.attributes or {})["http.response.status_code"] == 404
    assert json.loads(body)["error"]["message"]


async def test_a_messages_turn_is_traced_on_its_own_route_with_the_api_it_was_sent_in(
    traced_stack: Stack, exported: InMemorySpanExporter
) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 9,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    status, _, _ = await traced_stack.post(body, "/v1/messages")
    assert status == 200
    attributes = dict(only_span(exported).attributes or {})
    assert attributes["http.route"] == "/v1/messages"
    assert attributes["luftpause.upstream_api"] == "chat"
    assert attributes["luftpause.translated"] is True
    assert attributes["gen_ai.usage.input_tokens"] == 12  # read from the translated stream
