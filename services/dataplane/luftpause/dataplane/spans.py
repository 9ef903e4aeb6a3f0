"""The dataplane's span per proxied turn, with tracing on (`common.tracing`).

Shell module. `traced(handler, route)` is what `app` routes each turn's path to
(`/v1/chat/completions`, `/v1/messages`, `/v1/responses`) when the process traces (otherwise the
handler runs bare and this module costs nothing): a SERVER span named `chat <model>`, child of the
request's `traceparent` (the runtime sends one; own-loop agents may), current while the turn runs,
so the turn's log lines carry its trace id. The span's own `traceparent` goes on to the scheduler
(`AdmitRequest.traceparent`, its `admit` span's parent) and to the engine (replacing the client's
header). The turn's events as reported to the scheduler (started, first_token, finished, failed,
abandoned) are also recorded on the span (`turn.Turn` tells it each one), so each carries the trace
id.

Attributes (GenAI conventions where they apply): gen_ai.operation.name `chat`,
gen_ai.request.model, gen_ai.usage.input_tokens / output_tokens / cache_read.input_tokens,
gen_ai.response.finish_reasons; luftpause.run_id, luftpause.turn_id, luftpause.service_class,
luftpause.caller, luftpause.replica, luftpause.placed_by (scheduler|dataplane),
luftpause.held_ms (time held in the scheduler), luftpause.ttfb_ms (arrival to the first byte
sent back), luftpause.upstream_api (the API the engine was spoken to in) and
luftpause.translated (whether the turn was translated to it); http.route (the door),
http.response.status_code and error.type on failure. Nothing is built for a span
the sampler did not record.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Protocol

from aiohttp import web
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from luftpause.common import tracing
from luftpause.dataplane.reply import ReplySummary

SCOPE = "luftpause.dataplane"


class TracedHandler(Protocol):
    def __call__(
        self, request: web.Request, traced: TurnSpan | None = None
    ) -> Awaitable[web.StreamResponse]: ...


class TurnSpan:
    """The span of one turn and what the proxy tells it; a no-op on an unsampled span."""

    __slots__ = ("on", "route", "span", "traceparent")

    def __init__(self, span: Span, route: str) -> None:
        self.span = span
        self.route = route
        self.on = span.is_recording()
        self.traceparent = tracing.traceparent_of(span)

    def request(
        self, *, model: str, run_id: str, turn_id: str, service_class: str, caller: str
    ) -> None:
        """What the request says about the turn."""
        if not self.on:
            return
        self.span.update_name(f"chat {model}")
        self.span.set_attributes(
            {
                "http.request.method": "POST",
                "http.route": self.route,
                tracing.GEN_AI_OPERATION_NAME: "chat",
                tracing.GEN_AI_REQUEST_MODEL: model,
                "luftpause.run_id": run_id,
                "luftpause.turn_id": turn_id,
                "luftpause.service_class": service_class,
                "luftpause.caller": caller,
            }
        )

    def placed(self, replica_id: str, held_ms: float, *, locally: bool) -> None:
        if self.on:
            self.span.set_attributes(
                {
                    "luftpause.replica": replica_id,
                    "luftpause.held_ms": held_ms,
                    "luftpause.placed_by": "dataplane" if locally else "scheduler",
                }
            )

    def upstream(self, api: str, *, translated: bool) -> None:
        """The API the engine is spoken to in, and whether the turn was translated to it."""
        if self.on:
            self.span.set_attributes(
                {"luftpause.upstream_api": api, "luftpause.translated": translated}
            )

    def first_byte(self, seconds: float) -> None:
        if self.on:
            self.span.set_attribute("luftpause.ttfb_ms", seconds * 1000.0)

    def outgoing(self, headers: MutableMapping[str, str]) -> None:
        """The engine request's headers: this span's trace context replaces the client's."""
        tracing.inject(headers, trace.set_span_in_context(self.span))

    def event(self, kind: str) -> None:
        """A turn event without details, as reported: started, first_token, abandoned."""
        if self.on:
            self.span.add_event(kind)

    def finished(self, summary: ReplySummary) -> None:
        """The turn finished: its usage (when the engine reported it) and finish reason."""
        if not self.on:
            return
        self.span.add_event("finished")
        attributes: dict[str, int | list[str]] = {}
        if summary.usage is not None:
            attributes[tracing.GEN_AI_USAGE_INPUT_TOKENS] = summary.usage.prompt_tokens
            attributes[tracing.GEN_AI_USAGE_OUTPUT_TOKENS] = summary.usage.completion_tokens
            attributes[tracing.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = summary.usage.cached_tokens
        if summary.finish_reason:
            attributes[tracing.GEN_AI_RESPONSE_FINISH_REASONS] = [summary.finish_reason]
        self.span.set_attributes(attributes)

    def failed(self, reason: str) -> None:
        if self.on:
            self.span.add_event("failed")
            self.span.set_attribute(tracing.ERROR_TYPE, "turn_failed")
            self.span.set_status(Status(StatusCode.ERROR, reason))

    def end(self, status: int | None) -> None:
        """The response went out with `status` (None: the handler was cancelled)."""
        if self.on:
            if status is None:
                self.span.set_attribute(tracing.ERROR_TYPE, "client_gone")
            else:
                self.span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    self.span.set_status(Status(StatusCode.ERROR))
                    self.span.set_attribute(tracing.ERROR_TYPE, str(status))
        self.span.end()


def traced(
    handler: TracedHandler, route: str
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`handler` (serving `route`) inside a SERVER span per request (see the module docstring)."""
    tracer = tracing.tracer(SCOPE)

    async def handle(request: web.Request) -> web.StreamResponse:
        parent = propagate.extract(request.headers)
        span = tracer.start_span("chat", context=parent, kind=SpanKind.SERVER)
        turn = TurnSpan(span, route)
        status: int | None = None
        try:
            with trace.use_span(span, end_on_exit=False):
                response = await handler(request, turn)
            status = response.status
            return response
        except web.HTTPException as exc:  # answered by the error middleware outside
            status = exc.status
            raise
        except Exception:
            status = 500
            raise
        finally:
            turn.end(status)

    return handle
