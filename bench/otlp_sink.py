"""An OTLP/gRPC trace endpoint that accepts every export and keeps nothing: where the traced
arm of `bench.overhead` sends its spans, so the arm pays the whole cost of exporting (building,
batching, serialising, sending) and no collector's on top.

Run: `.venv/bin/python -m bench.otlp_sink --port 4317`; it counts what it was sent and says so
on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc
import uvloop
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc


class Sink(ts_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.exports = 0
        self.spans = 0

    async def Export(
        self, request: ts.ExportTraceServiceRequest, context: grpc.aio.ServicerContext
    ) -> ts.ExportTraceServiceResponse:
        self.exports += 1
        self.spans += sum(
            len(scope.spans) for spans in request.resource_spans for scope in spans.scope_spans
        )
        return ts.ExportTraceServiceResponse()


async def serve(port: int) -> None:
    sink = Sink()
    server = grpc.aio.server()
    ts_grpc.add_TraceServiceServicer_to_server(sink, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=1.0)
    print(f"otlp sink: {sink.spans} spans in {sink.exports} exports", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, default=4317)
    uvloop.run(serve(p.parse_args().port))


if __name__ == "__main__":
    main()
