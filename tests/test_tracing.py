"""`common.tracing`: when tracing is on, W3C trace context in and out, log lines' trace ids."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as semconv
from opentelemetry.trace import ProxyTracerProvider

from luftpause.common import tracing

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    """An SDK provider this module traces with; the process-wide one is left alone."""
    sdk = TracerProvider()
    tracing.install(sdk)
    try:
        yield sdk
    finally:
        tracing.uninstall()


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_tracing_is_wanted_only_with_an_otlp_endpoint_and_not_switched_off(
    environ: dict[str, str], wanted: bool
) -> None:
    assert tracing.wanted(environ) is wanted


def test_without_an_endpoint_setup_installs_no_tracer_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in tracing.ENDPOINT_VARS:
        monkeypatch.delenv(name, raising=False)
    assert tracing.setup("dataplane") is False
    assert not tracing.enabled()
    assert isinstance(trace.get_tracer_provider(), ProxyTracerProvider)
    tracing.shutdown()  # a no-op when off


def test_a_spans_traceparent_names_it_and_parses_back(provider: TracerProvider) -> None:
    span = tracing.tracer("test").start_span("s")
    ctx = span.get_span_context()
    parsed = tracing.span_context_of(tracing.traceparent_of(span))
    assert parsed is not None and parsed.is_remote
    assert (parsed.trace_id, parsed.span_id) == (ctx.trace_id, ctx.span_id)
    assert parsed.trace_flags.sampled
    span.end()


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-zzf7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ],
)
def test_a_malformed_traceparent_names_no_parent(header: str | None) -> None:
    assert tracing.span_context_of(header) is None
    assert tracing.context_of(header) is None


def test_a_span_started_in_a_traceparents_context_is_its_child(provider: TracerProvider) -> None:
    span = tracing.tracer("test").start_span("child", context=tracing.context_of(TRACEPARENT))
    assert span.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331  # type: ignore[attr-defined]
    span.end()


def test_inject_replaces_the_traceparent_a_request_came_with(provider: TracerProvider) -> None:
    span = tracing.tracer("test").start_span("s")
    headers = {"Traceparent": TRACEPARENT, "tracestate": "a=b", "x-other": "1"}
    tracing.inject(headers, trace.set_span_in_context(span))
    assert headers == {"x-other": "1", "traceparent": tracing.traceparent_of(span)}
    span.end()


def test_log_lines_carry_the_current_spans_trace_and_span_ids(provider: TracerProvider) -> None:
    assert "trace_id" not in tracing.add_trace_ids(None, "info", {})
    with tracing.tracer("test").start_as_current_span("s") as span:
        ids = tracing.add_trace_ids(None, "info", {"event": "x"})
    ctx = span.get_span_context()
    assert ids == {
        "event": "x",
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
    }


def test_the_genai_attribute_names_are_the_semantic_conventions() -> None:
    ours = {name: value for name, value in vars(tracing).items() if name.startswith("GEN_AI_")}
    assert ours and all(getattr(semconv, name) == value for name, value in ours.items())
