"""OpenTelemetry tracing for every service: spans over OTLP/gRPC, or nothing at all.

Shell module. `setup(service)` installs the SDK's tracer provider with a `BatchSpanProcessor`
and the OTLP/gRPC exporter when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, unless `OTEL_SDK_DISABLED=true` or
`OTEL_TRACES_EXPORTER=none`. The SDK reads the rest of the standard variables itself:
`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (service.name defaults to
`luftpause-<service>`), `OTEL_EXPORTER_OTLP_*` (headers, certificate, timeout, compression),
`OTEL_TRACES_SAMPLER`(`_ARG`), `OTEL_BSP_*`, `OTEL_PROPAGATORS`. `shutdown()` flushes what is
queued (bounded by `OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s by default).

Cost model: with tracing off the SDK is never imported, no provider is installed (the API's
no-op tracer stays), and the services create no spans of their own: every call site checks
`enabled()` (a module global) first, or was chosen at startup. With tracing on, callers check
`span.is_recording()` before building attributes, so a sampler that drops a trace drops its cost
too.

Propagation is W3C trace context: `traceparent` on HTTP requests (`inject`), in the
scheduler's `AdmitRequest.traceparent`, and in a run's journaled spec (`traceparent_of`,
`context_of`). Log lines written while a span is current carry its `trace_id` and `span_id`
(`add_trace_ids`, installed by `common.logs` when tracing is on).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags, Tracer

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
TRACEPARENT = "traceparent"

# GenAI semantic conventions (gen_ai.*, OpenTelemetry semconv 1.37+); the incubating constants
# of opentelemetry-semantic-conventions are not imported on the hot path (tests compare them).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_AGENT_ID = "gen_ai.agent.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"

_enabled = False
_provider: Any = None  # the SDK's TracerProvider once installed (the SDK is imported lazily)
_tracers: dict[str, Tracer] = {}


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for tracing (an OTLP endpoint, and not switched off)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARS)


def setup(service: str, *, instance: str | None = None) -> bool:
    """Install the SDK tracer provider exporting over OTLP/gRPC if `wanted()`; True if it did.

    `service` names the default service.name (`luftpause-<service>`); `instance`, if given,
    the default service.instance.id. The environment's own names win over both.
    """
    if _enabled or not wanted():
        return _enabled
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = OTELResourceDetector().detect().attributes
    defaults = {"service.name": f"luftpause-{service}", "service.instance.id": instance}
    attributes = {k: v for k, v in defaults.items() if v and k not in named}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    install(provider)
    return True


def install(provider: Any) -> None:
    """Trace with `provider` from now on (tests pass an SDK provider with an in-memory
    exporter; the process-wide provider, which can be set only once, is left alone)."""
    global _enabled, _provider
    _provider = provider
    _enabled = True
    _tracers.clear()


def uninstall() -> None:
    """Back to tracing off (tests)."""
    global _enabled, _provider
    _provider = None
    _enabled = False
    _tracers.clear()


def shutdown() -> None:
    """Export what is queued and stop the exporter; a no-op when tracing is off."""
    provider = _provider
    uninstall()
    if provider is not None and hasattr(provider, "shutdown"):
        provider.shutdown()


def enabled() -> bool:
    """Whether this process traces."""
    return _enabled


def tracer(name: str) -> Tracer:
    """The tracer of instrumentation scope `name` (the API's no-op one when tracing is off)."""
    found = _tracers.get(name)
    if found is None:
        found = _provider.get_tracer(name) if _provider is not None else trace.get_tracer(name)
        _tracers[name] = found
    return found


def traceparent_of(span: Span) -> str:
    """The W3C `traceparent` naming `span` as the parent ("" for an invalid span)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def span_context_of(traceparent: str | None) -> SpanContext | None:
    """The remote span context a W3C `traceparent` names; None if absent or malformed."""
    if not traceparent:
        return None
    parts = traceparent.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff":
        return None
    version, trace_id, span_id, flags = parts[:4]
    if len(trace_id) != 32 or len(span_id) != 16 or len(flags) != 2:
        return None
    if version == "00" and len(parts) != 4:
        return None
    try:
        ctx = SpanContext(
            trace_id=int(trace_id, 16),
            span_id=int(span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(int(flags, 16)),
        )
    except ValueError:
        return None
    return ctx if ctx.is_valid else None


def context_of(traceparent: str | None) -> Context | None:
    """A context whose current span is the remote parent `traceparent` names, else None."""
    ctx = span_context_of(traceparent)
    return None if ctx is None else trace.set_span_in_context(NonRecordingSpan(ctx))


def inject(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Set the propagation headers (`traceparent`, `tracestate`, ...) of `context` (default:
    the current one) in `headers`, replacing any there."""
    for name in [k for k in headers if k.lower() in ("traceparent", "tracestate")]:
        del headers[name]
    propagate.inject(headers, context=context)


def add_trace_ids(logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: the current span's `trace_id` and `span_id`, if there is one."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict.setdefault("trace_id", f"{ctx.trace_id:032x}")
        event_dict.setdefault("span_id", f"{ctx.span_id:016x}")
    return event_dict
