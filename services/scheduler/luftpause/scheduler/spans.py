"""The scheduler's `admit` span per admission, with tracing on (`common.tracing`).

Shell module, called by `rpc` only while the process traces; the core stays pure and knows
nothing of spans. It reads the core's values (the `Admit` event, the `Place` action), never the
gRPC messages. An `admit` span (kind SERVER) starts when an admission arrives, on a Report
stream or the unary Admit, as the child of the dataplane's turn span (`AdmitRequest.traceparent`,
else the unary call's `traceparent` metadata), and ends when the turn is placed (from the core's
`Place`: luftpause.replica, luftpause.held_ms), refused (status error), or withdrawn while held
(error.type `abandoned`). A turn its dataplane placed itself on an open replica gets a span that
ends at once (luftpause.placed_by `dataplane`, held 0 ms).

Why a turn was held (luftpause.held_reason) is read from the state right after its Admit event,
when the core did not place it at once (`held_reason`): `affinity` (it waits for its run's
replica, where its context is cached), `kv` (replicas of its model have room but the KV rule
keeps new runs off them), `capacity` (none has room), `unhealthy` (none is healthy).
"""

from __future__ import annotations

from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from luftpause.common import tracing
from luftpause.scheduler.core import events as e
from luftpause.scheduler.core.state import State

SCOPE = "luftpause.scheduler"


def held_reason(state: State, turn_id: str) -> str | None:
    """Why the held turn `turn_id` waits (see the module docstring); None if it is not held."""
    held = state.held.get(turn_id)
    if held is None:
        return None
    kind, _, model = held.bucket
    if kind == "r":
        return "affinity"
    by_model = state.single_pass_by_model if held.single_pass else state.generative_by_model
    replicas = [state.replicas[rid] for rid in by_model.get(model, ()) if rid in state.replicas]
    if not any(r.healthy for r in replicas):
        return "unhealthy"
    if kind == "m" and state.room_for(("o", model, held.service_class)):
        return "kv"
    return "capacity"


def start(admit: e.Admit, traceparent: str = "") -> Span:
    """The span of an admission that just arrived, the child of `traceparent` if one came."""
    parent = tracing.context_of(traceparent)
    span = tracing.tracer(SCOPE).start_span("admit", context=parent, kind=SpanKind.SERVER)
    if span.is_recording():
        span.set_attributes(
            {
                "luftpause.turn_id": admit.turn_id,
                "luftpause.run_id": admit.run_id,
                tracing.GEN_AI_REQUEST_MODEL: admit.model,
                "luftpause.service_class": str(admit.service_class),
                "luftpause.caller": admit.caller,
                "luftpause.dataplane": admit.dataplane,
                "luftpause.single_pass": admit.single_pass,
            }
        )
    return span


def admitted(span: Span, state: State, turn_id: str) -> None:
    """The Admit event was applied; if the turn is held now, say why."""
    if span.is_recording():
        reason = held_reason(state, turn_id)
        if reason is not None:
            span.set_attribute("luftpause.held_reason", reason)


def placed(span: Span, place: e.Place) -> None:
    if span.is_recording():
        span.set_attributes(
            {
                "luftpause.replica": place.replica_id,
                "luftpause.held_ms": place.held_s * 1000.0,
                "luftpause.placed_by": "scheduler",
            }
        )
    span.end()


def refused(span: Span, message: str) -> None:
    if span.is_recording():
        span.set_attribute(tracing.ERROR_TYPE, "refused")
        span.set_status(Status(StatusCode.ERROR, message))
    span.end()


def abandoned(span: Span) -> None:
    """The admission was withdrawn (its client gave up, or its stream ended) while held."""
    if span.is_recording():
        span.set_attribute(tracing.ERROR_TYPE, "abandoned")
    span.end()


def reported(admit: e.Admit, traceparent: str = "") -> None:
    """A turn its dataplane placed itself on an open replica: a span that ends at once."""
    span = start(admit, traceparent)
    if span.is_recording():
        span.set_attributes(
            {
                "luftpause.replica": admit.placed_on,
                "luftpause.held_ms": 0.0,
                "luftpause.placed_by": "dataplane",
            }
        )
    span.end()
