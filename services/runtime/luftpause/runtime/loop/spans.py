"""The runtime's spans, with tracing on (`common.tracing`): GenAI agent, chat and tool spans.

Shell module; every caller checks `tracing.enabled()` (or holds a span only when it is on), so
with tracing off nothing here runs. Spans, in GenAI semantic conventions:

- `invoke_agent luftpause-subagent` (INTERNAL) per run: gen_ai.agent.id and
  gen_ai.conversation.id (the run's handle), gen_ai.agent.name, gen_ai.request.model,
  luftpause.parent_run, luftpause.caller, luftpause.service_class; at its end the run's state
  (luftpause.run.state), usage (gen_ai.usage.*), tool calls, and error.type if it failed. Its
  parent, in order: the parent run's span (spawn with `parent`; the parent's journaled trace if
  it is over), the `traceparent` of the MCP request that called spawn (`_meta`, else the HTTP
  header), else none (a root). Its own traceparent is journaled with the run's spec; a run
  resumed after a restart gets a new root span linked to that one (luftpause.resumed).
- `chat <model>` (CLIENT) per model request: gen_ai.operation.name, gen_ai.provider.name,
  gen_ai.request.model, gen_ai.request.max_tokens, gen_ai.response.id / model /
  finish_reasons, gen_ai.usage.input_tokens / output_tokens / cache_read.input_tokens. Its
  traceparent goes to the dataplane, whose turn span is its child.
- `execute_tool <tool>` (INTERNAL) per tool call: gen_ai.tool.name, gen_ai.tool.call.id,
  gen_ai.tool.type `extension` (an MCP server's), luftpause.tool_server, error.type
  `tool_error` for a failed call. The MCP client's own span (`MCP send tools/call <tool>`) is
  its child, and its traceparent goes to HTTP tool servers in the request's `_meta` and, by
  `outbound.http_transport`, in the `traceparent` header.

`TraceHeaders` makes an MCP request's `traceparent` header the ambient parent, so the mcp SDK's
own server spans (`tools/call spawn`) join the caller's trace too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from luftpause.common import tracing
from luftpause.runtime.core import machine as m

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context as McpContext


SCOPE = "luftpause.runtime"
AGENT_NAME = "luftpause-subagent"
PROVIDER = "openai"  # the API the runtime speaks to the dataplane

Scope = dict[str, Any]


def _tracer() -> trace.Tracer:
    return tracing.tracer(SCOPE)


def _agent_attributes(spec: m.RunSpec) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        tracing.GEN_AI_OPERATION_NAME: "invoke_agent",
        tracing.GEN_AI_PROVIDER_NAME: PROVIDER,
        tracing.GEN_AI_AGENT_ID: spec.handle,
        tracing.GEN_AI_AGENT_NAME: AGENT_NAME,
        tracing.GEN_AI_CONVERSATION_ID: spec.handle,
        tracing.GEN_AI_REQUEST_MODEL: spec.model,
        "luftpause.caller": spec.caller,
        "luftpause.service_class": spec.service_class,
    }
    if spec.parent is not None:
        attributes["luftpause.parent_run"] = spec.parent
    return attributes


def start_run(spec: m.RunSpec, parent: Context | None) -> Span:
    """A new run's span; `parent` None makes it a root (never the ambient MCP request span)."""
    return _tracer().start_span(
        f"invoke_agent {AGENT_NAME}",
        context=parent if parent is not None else Context(),
        kind=SpanKind.INTERNAL,
        attributes=_agent_attributes(spec),
    )


def resume_run(spec: m.RunSpec) -> Span:
    """The span of a run resumed from the journal: a root linked to its journaled span."""
    journaled = tracing.span_context_of(spec.traceparent)
    return _tracer().start_span(
        f"invoke_agent {AGENT_NAME}",
        context=Context(),
        kind=SpanKind.INTERNAL,
        attributes={**_agent_attributes(spec), "luftpause.resumed": True},
        links=[Link(journaled)] if journaled is not None else None,
    )


def parent_context(parent: Span | None, journaled: str | None, caller: str | None) -> Context:
    """Where a new run's span hangs: its parent run's live span, else that run's journaled
    traceparent, else the caller's traceparent; an empty context (a root) if none."""
    if parent is not None:
        return trace.set_span_in_context(parent)
    return tracing.context_of(journaled) or tracing.context_of(caller) or Context()


def ended(span: Span, state: m.RunState) -> None:
    """End a run's span with what the run came to (still running: the runtime is stopping)."""
    if span.is_recording():
        usage = state.usage
        span.set_attributes(
            {
                "luftpause.run.state": state.phase.value,
                "luftpause.tool_calls": state.tool_calls,
                "luftpause.turns": usage.turns,
                tracing.GEN_AI_USAGE_INPUT_TOKENS: usage.prompt_tokens,
                tracing.GEN_AI_USAGE_OUTPUT_TOKENS: usage.completion_tokens,
                tracing.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: usage.cached_prompt_tokens,
            }
        )
        if state.phase is m.Phase.FAILED:
            span.set_attribute(tracing.ERROR_TYPE, "run_failed")
            span.set_status(Status(StatusCode.ERROR, state.error or ""))
        elif not state.phase.over:
            span.set_attribute("luftpause.interrupted", True)
    span.end()


@contextmanager
def chat(spec: m.RunSpec) -> Iterator[Span]:
    """The current span of one model request of the run `spec`."""
    attributes: dict[str, Any] = {
        tracing.GEN_AI_OPERATION_NAME: "chat",
        tracing.GEN_AI_PROVIDER_NAME: PROVIDER,
        tracing.GEN_AI_REQUEST_MODEL: spec.model,
        tracing.GEN_AI_CONVERSATION_ID: spec.handle,
    }
    if spec.max_tokens:
        attributes[tracing.GEN_AI_REQUEST_MAX_TOKENS] = spec.max_tokens
    with _tracer().start_as_current_span(
        f"chat {spec.model}", kind=SpanKind.CLIENT, attributes=attributes
    ) as span:
        yield span


def chat_headers(span: Span, headers: dict[str, str]) -> dict[str, str]:
    """`headers` plus the chat span's trace context, for the dataplane."""
    tracing.inject(headers, trace.set_span_in_context(span))
    return headers


def chat_reply(span: Span, reply: Mapping[str, Any], usage: m.Usage) -> None:
    """What the model answered (a chat completion's JSON), on the chat span."""
    if not span.is_recording():
        return
    choices = reply.get("choices") or []
    reasons = [str(c["finish_reason"]) for c in choices if c.get("finish_reason")]
    span.set_attributes(
        {
            tracing.GEN_AI_RESPONSE_ID: str(reply.get("id") or ""),
            tracing.GEN_AI_RESPONSE_MODEL: str(reply.get("model") or ""),
            tracing.GEN_AI_RESPONSE_FINISH_REASONS: reasons,
            tracing.GEN_AI_USAGE_INPUT_TOKENS: usage.prompt_tokens,
            tracing.GEN_AI_USAGE_OUTPUT_TOKENS: usage.completion_tokens,
            tracing.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: usage.cached_prompt_tokens,
        }
    )


@contextmanager
def tool(call: m.ToolCall, server: str | None) -> Iterator[Span]:
    """The current span of one tool call (`server`: the upstream MCP server that has the tool)."""
    attributes: dict[str, Any] = {
        tracing.GEN_AI_OPERATION_NAME: "execute_tool",
        tracing.GEN_AI_TOOL_NAME: call.name,
        tracing.GEN_AI_TOOL_CALL_ID: call.id,
        tracing.GEN_AI_TOOL_TYPE: "extension",
    }
    if server is not None:
        attributes["luftpause.tool_server"] = server
    with _tracer().start_as_current_span(
        f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attributes
    ) as span:
        yield span


def tool_result(span: Span, result: m.ToolResult) -> None:
    if span.is_recording() and not result.ok:
        span.set_attribute(tracing.ERROR_TYPE, "tool_error")
        span.set_status(Status(StatusCode.ERROR, result.content[:200]))


def caller_traceparent(ctx: McpContext[Any, Any] | None) -> str | None:
    """The `traceparent` of the MCP request behind a tool call: its `_meta`, else its header."""
    if ctx is None:
        return None
    try:
        meta = ctx.request_context.meta
        found = meta.get(tracing.TRACEPARENT) if isinstance(meta, Mapping) else None
        if isinstance(found, str) and tracing.span_context_of(found) is not None:
            return found
        headers = ctx.headers or {}
        header = headers.get(tracing.TRACEPARENT)
    except (AttributeError, LookupError, ValueError):
        return None
    return str(header) if header else None


class TraceHeaders:
    """ASGI wrapper: an HTTP request's trace context headers are the ambient context while it
    is served (the mcp SDK runs a message's handler in the context that received it)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        carrier = _headers(scope) if scope.get("type") == "http" else {}
        if tracing.TRACEPARENT not in carrier:
            await self.app(scope, receive, send)
            return
        token = otel_context.attach(propagate.extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            otel_context.detach(token)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or ()}
