"""An in-process OTLP/gRPC trace receiver for tests: the collector's TraceService, keeping
every span it is sent, flattened to plain values."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

KINDS = {
    SpanProto.SPAN_KIND_INTERNAL: "internal",
    SpanProto.SPAN_KIND_SERVER: "server",
    SpanProto.SPAN_KIND_CLIENT: "client",
}


@dataclass(frozen=True)
class Received:
    """One exported span: ids in hex, as W3C traceparent writes them."""

    service: str
    scope: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: tuple[str, ...]
    links: tuple[tuple[str, str], ...]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


def _attributes(items: Sequence[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


@dataclass
class Collector(ts_grpc.TraceServiceServicer):
    spans: list[Received] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def Export(
        self, request: ts.ExportTraceServiceRequest, context: grpc.aio.ServicerContext
    ) -> ts.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name"))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        Received(
                            service=service,
                            scope=scope_spans.scope.name,
                            name=span.name,
                            kind=KINDS.get(span.kind, "other"),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes=_attributes(span.attributes),
                            events=tuple(e.name for e in span.events),
                            links=tuple((k.trace_id.hex(), k.span_id.hex()) for k in span.links),
                        )
                    )
        self.changed.set()
        return ts.ExportTraceServiceResponse()

    async def until(self, done: Callable[[list[Received]], bool]) -> list[Received]:
        """The spans so far, once `done` says they are enough (bound the wait outside)."""
        while not done(self.spans):
            self.changed.clear()
            await self.changed.wait()
        return list(self.spans)


async def start_collector() -> tuple[grpc.aio.Server, int, Collector]:
    """A receiver on a free loopback port; stop the server when done."""
    collector = Collector()
    server = grpc.aio.server()
    ts_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port, collector
