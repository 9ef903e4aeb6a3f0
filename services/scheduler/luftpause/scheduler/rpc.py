"""The gRPC surface of the scheduler: the servicer and the Report streams it keeps.

Shell layer: no decisions here, and no translation either (`wire` turns messages into core
events and core values into messages). `Admit` registers a waiter, applies the event and
awaits the placement; a client cancel arrives as CancelledError and becomes `TurnAbandoned`. A
`Report` does the same for each admission on it and writes placements back as they resolve.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import structlog
from opentelemetry.trace import Span

from luftpause.common import tracing
from luftpause.rpc import scheduler_pb2 as pb
from luftpause.rpc import scheduler_pb2_grpc as pb_grpc
from luftpause.scheduler import spans, wire
from luftpause.scheduler.core import events as e
from luftpause.scheduler.core.state import State
from luftpause.scheduler.host import SchedulerHost, TurnRejected

log = structlog.get_logger(__name__)

DATAPLANE_METADATA = "x-luftpause-dataplane"
# WatchStatus sends a status at most this often, whatever the client asks.
MIN_WATCH_INTERVAL_MS = 100
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Scheduler"].full_name


def traceparent_of(context: grpc.aio.ServicerContext) -> str:
    """The `traceparent` a unary call carries in its metadata ("" if none)."""
    for key, value in context.invocation_metadata() or ():
        if key == tracing.TRACEPARENT and isinstance(value, str):
            return value
    return ""


def dataplane_of(context: grpc.aio.ServicerContext) -> str:
    """The dataplane id a Report stream names in its metadata (else its peer address)."""
    for key, value in context.invocation_metadata() or ():
        if key == DATAPLANE_METADATA and isinstance(value, str) and value:
            return value
    return str(context.peer())


def _without_waits(reply: pb.StatusReply) -> bytes:
    """The status as bytes, held turns' oldest waits left out (they change every moment)."""
    copy = pb.StatusReply()
    copy.CopyFrom(reply)
    for group in copy.held:
        group.oldest_wait_seconds = 0.0
    return copy.SerializeToString(deterministic=True)


class _ReportStream:
    """One dataplane's Report stream: applies what comes up, writes placements down.

    Every admission waits on a host future like a unary Admit does; when it resolves, its
    placement joins the outgoing queue, and one writer task sends whatever is queued as one
    message, with the newest list of open replicas if it changed meanwhile (the first message
    of a stream always carries it). A turn the dataplane placed itself is applied and answered
    with nothing. Closing gives up the admissions still held, exactly as cancelled unary calls
    would.
    """

    def __init__(
        self,
        host: SchedulerHost,
        context: grpc.aio.ServicerContext,
        dataplane: str,
        opened: pb.OpenReplicas,
    ) -> None:
        self._host = host
        self._context = context
        self.dataplane = dataplane
        self._waiting: dict[str, tuple[asyncio.Future[e.Place], float]] = {}
        # With tracing on, the `admit` spans of the admissions still waiting.
        self._spans: dict[str, Span] = {}
        # Placements, the open replicas, and (as plain strings) ids of runs taken elsewhere.
        self._out: asyncio.Queue[pb.Placement | pb.OpenReplicas | str] = asyncio.Queue()
        self._out.put_nowait(opened)
        self._writer = asyncio.create_task(self._write())

    def send_open(self, opened: pb.OpenReplicas) -> None:
        self._out.put_nowait(opened)

    def send_taken(self, run_id: str) -> None:
        self._out.put_nowait(run_id)

    def receive(self, batch: pb.DataplaneBatch) -> None:
        host = self._host
        for item in batch.items:
            if item.HasField("admit"):
                self._admit(item.admit)
                continue
            event = wire.turn_event(item.event, host.now())
            if event is None:
                continue
            if isinstance(event, e.TurnFailed):
                host.metrics.failed_turn(host.state, event.turn_id)
            host.apply(event)

    def _admit(self, request: pb.AdmitRequest) -> None:
        turn_id = request.turn_id
        if wire.missing_fields(request):
            self._refuse(turn_id, grpc.StatusCode.INVALID_ARGUMENT, wire.MISSING_FIELDS)
            return
        if turn_id in self._waiting:
            return  # sent twice on this stream; the first admission still waits
        host = self._host
        admit = wire.admit_event(request, host.now(), time.time())
        if admit.placed_on:
            host.metrics.placed_by_dataplane.inc()
            host.apply(admit)
            if tracing.enabled():
                spans.reported(admit, request.traceparent)
            return
        span = spans.start(admit, request.traceparent) if tracing.enabled() else None
        fut = host.wait_for(turn_id)
        self._waiting[turn_id] = (fut, time.perf_counter())
        fut.add_done_callback(lambda f: self._resolved(turn_id, f))
        host.apply(admit)
        if span is not None:
            self._spans[turn_id] = span
            spans.admitted(span, host.state, turn_id)

    def _resolved(self, turn_id: str, fut: asyncio.Future[e.Place]) -> None:
        if fut.cancelled():
            return
        _, started = self._waiting.pop(turn_id, (fut, 0.0))
        span = self._spans.pop(turn_id, None) if self._spans else None
        exc = fut.exception()
        if span is not None and exc is None:
            spans.placed(span, fut.result())
        elif span is not None:
            spans.refused(span, str(exc))
        if isinstance(exc, TurnRejected):
            code, retry_after = _refusal_code(exc)
            self._out.put_nowait(wire.refusal(turn_id, code.value[0], str(exc), retry_after))
            return
        if exc is not None:
            self._refuse(turn_id, grpc.StatusCode.INTERNAL, str(exc))
            return
        self._host.metrics.admit_seconds.observe(time.perf_counter() - started)
        self._out.put_nowait(wire.placement(fut.result()))

    def _refuse(self, turn_id: str, code: grpc.StatusCode, message: str) -> None:
        self._out.put_nowait(wire.refusal(turn_id, code.value[0], message))

    async def _write(self) -> None:
        out = self._out
        while True:
            batch = pb.PlacementBatch()
            item = await out.get()
            while True:
                if isinstance(item, pb.OpenReplicas):
                    batch.open.CopyFrom(item)  # the newest list replaces any older one
                elif isinstance(item, str):
                    batch.taken_runs.append(item)
                else:
                    batch.placements.append(item)
                if out.empty():
                    break
                item = out.get_nowait()
            await self._context.write(batch)

    def close(self) -> None:
        """The stream ended: withdraw the admissions still held, stop writing."""
        waiting, self._waiting = self._waiting, {}
        for turn_id, (fut, _) in waiting.items():
            self._host.give_up(turn_id, fut)
            fut.cancel()
        for span in self._spans.values():
            spans.abandoned(span)
        self._spans.clear()
        self._writer.cancel()

    async def drained(self) -> None:
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError, RuntimeError):
            await self._writer


class SchedulerService(pb_grpc.SchedulerServicer):
    def __init__(self, host: SchedulerHost) -> None:
        self.host = host
        self._sessions: set[_ReportStream] = set()
        self._open = wire.open_message(host.state)
        host.on_open_changed(self._publish_open)
        host.on_run_taken(self._publish_taken)

    def _publish_taken(self, taken: e.RunTaken) -> None:
        for session in self._sessions:
            if session.dataplane == taken.dataplane:
                session.send_taken(taken.run_id)

    def _publish_open(self, state: State) -> None:
        opened = wire.open_message(state)
        if opened == self._open:
            return
        self._open = opened
        for session in self._sessions:
            session.send_open(opened)

    async def Admit(
        self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext
    ) -> pb.AdmitReply:
        started = time.perf_counter()
        if wire.missing_fields(request):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, wire.MISSING_FIELDS)
        host = self.host
        admit = wire.admit_event(request, host.now(), time.time())
        span = None
        if tracing.enabled():
            span = spans.start(admit, request.traceparent or traceparent_of(context))
        fut = host.wait_for(request.turn_id)
        host.apply(admit)
        if span is not None:
            spans.admitted(span, host.state, request.turn_id)
        try:
            place = await fut
        except TurnRejected as exc:
            if span is not None:
                spans.refused(span, str(exc))
            code, retry_after = _refusal_code(exc)
            if retry_after:
                await context.send_initial_metadata((("retry-after", f"{retry_after:.3f}"),))
            await context.abort(code, str(exc))
        except asyncio.CancelledError:
            if span is not None:
                spans.abandoned(span)
            host.give_up(request.turn_id, fut)
            raise
        host.metrics.admit_seconds.observe(time.perf_counter() - started)
        if span is not None:
            spans.placed(span, place)
        return wire.admit_reply(place)

    async def Report(
        self, request_iterator: AsyncIterator[pb.DataplaneBatch], context: grpc.aio.ServicerContext
    ) -> None:
        host = self.host
        dataplane = dataplane_of(context)
        session = _ReportStream(host, context, dataplane, self._open)
        self._sessions.add(session)
        host.apply(e.DataplaneConnected(at=host.now(), dataplane=dataplane))
        try:
            async for batch in request_iterator:
                session.receive(batch)
        finally:
            self._sessions.discard(session)
            session.close()
            host.apply(e.DataplaneDisconnected(at=host.now(), dataplane=dataplane))
            await session.drained()

    async def Resync(
        self, request: pb.ResyncRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResyncReply:
        event = wire.resync_event(request, self.host.now())
        self.host.apply(event)
        log.info(
            "resync", dataplane=request.dataplane_id, runs=len(event.runs), turns=len(event.turns)
        )
        return wire.resync_reply(event)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsReply:
        return wire.models_reply(self.host.state)

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusReply:
        return wire.status_reply(self.host.state, self.host.now())

    async def WatchStatus(
        self, request: pb.WatchStatusRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StatusReply]:
        """The status now, then each time it changes, at most every `min_interval_ms`."""
        interval = max(request.min_interval_ms, MIN_WATCH_INTERVAL_MS) / 1000.0
        changed = self.host.watch()
        try:
            last = b""
            while True:
                changed.clear()
                reply = wire.status_reply(self.host.state, self.host.now())
                # The held turns' waits grow with the clock: compare the status without them.
                shape = _without_waits(reply)
                if shape != last:
                    last = shape
                    yield reply
                await asyncio.sleep(interval)
                await changed.wait()
        finally:
            self.host.unwatch(changed)


def serve_on(server: grpc.aio.Server, host: SchedulerHost) -> SchedulerService:
    """Add the Scheduler service, answering from `host`, to `server`."""
    service = SchedulerService(host)
    pb_grpc.add_SchedulerServicer_to_server(service, server)
    return service


def _refusal_code(exc: TurnRejected) -> tuple[grpc.StatusCode, float]:
    """The gRPC status of a refused admission, and its Retry-After in seconds (0: none)."""
    if exc.rate_limited:
        return grpc.StatusCode.RESOURCE_EXHAUSTED, exc.retry_after_s
    return grpc.StatusCode.NOT_FOUND, 0.0
