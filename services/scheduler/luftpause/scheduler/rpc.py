"""The gRPC surface of the scheduler: translates messages to core events and back.

Shell layer: no decisions here. `Admit` registers a waiter, applies the event and awaits the
placement; a client cancel arrives as CancelledError and becomes `TurnAbandoned`. A `Session`
does the same for each admission on it and writes placements back as they resolve.
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
from luftpause.scheduler import spans
from luftpause.scheduler.core import events as e
from luftpause.scheduler.core import model as m
from luftpause.scheduler.core.placement import open_replicas
from luftpause.scheduler.core.status import status_view
from luftpause.scheduler.host import SchedulerHost, TurnRejected

log = structlog.get_logger(__name__)

_CLASS_IN: dict[int, m.ServiceClass] = {pb.SERVICE_CLASS_BATCH: m.ServiceClass.BATCH}
_CLASS_OUT = {
    m.ServiceClass.INTERACTIVE: pb.SERVICE_CLASS_INTERACTIVE,
    m.ServiceClass.BATCH: pb.SERVICE_CLASS_BATCH,
}
_PHASE_IN: dict[int, m.Phase] = {
    pb.RUN_PHASE_GENERATING: m.Phase.GENERATING,
    pb.RUN_PHASE_TOOL_PAUSED: m.Phase.TOOL_PAUSED,
}
_PHASE_OUT = {
    m.Phase.IDLE: pb.RUN_PHASE_IDLE,
    m.Phase.GENERATING: pb.RUN_PHASE_GENERATING,
    m.Phase.TOOL_PAUSED: pb.RUN_PHASE_TOOL_PAUSED,
}


DATAPLANE_METADATA = "x-luftpause-dataplane"
# WatchStatus sends a status at most this often, whatever the client asks.
MIN_WATCH_INTERVAL_MS = 100
# More keys than a dataplane sends (tools and four messages) are never read.
MAX_OPENING_KEYS = 8


def traceparent_of(context: grpc.aio.ServicerContext) -> str:
    """The `traceparent` a unary call carries in its metadata ("" if none)."""
    for key, value in context.invocation_metadata() or ():
        if key == tracing.TRACEPARENT and isinstance(value, str):
            return value
    return ""


def dataplane_of(context: grpc.aio.ServicerContext) -> str:
    """The dataplane id a Session stream names in its metadata (else its peer address)."""
    for key, value in context.invocation_metadata() or ():
        if key == DATAPLANE_METADATA and isinstance(value, str) and value:
            return value
    return str(context.peer())


def service_class(value: int) -> m.ServiceClass:
    return _CLASS_IN.get(value, m.ServiceClass.INTERACTIVE)


def turn_event(ev: pb.TurnEvent, at: float) -> e.Event | None:
    """The core event for one reported turn event (None for an empty one)."""
    kind = ev.WhichOneof("kind")
    if kind == "finished":
        u = ev.finished.usage
        return e.TurnFinished(
            at=at,
            turn_id=ev.turn_id,
            tool_calls=ev.finished.tool_calls,
            prompt_tokens=u.prompt_tokens,
            completion_tokens=u.completion_tokens,
            cached_tokens=u.cached_tokens,
            finish_reason=ev.finished.finish_reason,
        )
    if kind == "failed":
        return e.TurnFailed(at=at, turn_id=ev.turn_id, reason=ev.failed.reason)
    if kind == "abandoned":
        return e.TurnAbandoned(at=at, turn_id=ev.turn_id)
    if kind == "run_ended":
        return e.RunEnded(at=at, run_id=ev.run_id)
    if kind == "started":
        return e.TurnStarted(at=at, turn_id=ev.turn_id)
    if kind == "first_token":
        return e.FirstToken(at=at, turn_id=ev.turn_id)
    return None


def resync_event(req: pb.ResyncRequest, at: float) -> e.Resync:
    runs = tuple(
        e.RunSnapshot(
            run_id=r.run_id,
            replica=r.replica_id,
            phase=_PHASE_IN.get(r.phase, m.Phase.IDLE),
            service_class=service_class(r.service_class),
            caller=r.caller,
            idle_seconds=max(r.idle_seconds, 0.0),
        )
        for r in req.runs
        if r.run_id
    )
    turns = tuple(
        e.TurnSnapshot(
            turn_id=t.turn_id,
            run_id=t.run_id,
            replica=t.replica_id,
            model=t.model,
            service_class=service_class(t.service_class),
            caller=t.caller,
        )
        for t in req.turns
        if t.turn_id and t.replica_id
    )
    return e.Resync(at=at, dataplane=req.dataplane_id, runs=runs, turns=turns)


def status_reply(host: SchedulerHost) -> pb.StatusReply:
    view = status_view(host.state, host.now())
    reply = pb.StatusReply(turns_in_flight=view["turns_in_flight"])
    for r in view["replicas"]:
        reply.replicas.add(
            id=r["id"],
            url=r["url"],
            healthy=r["healthy"],
            in_flight=r["in_flight"],
            capacity=r["capacity"] or 0,
            capped=r["capped"],
            engine_running=-1 if r["engine_running"] is None else r["engine_running"],
            engine_waiting=-1 if r["engine_waiting"] is None else r["engine_waiting"],
            models=r["models"],
            kind=r["kind"],
            paused_interactive=r["paused_interactive"],
            kv_tokens=r["kv"]["tokens"] or 0,
            kv_used=-1 if r["kv"]["used"] is None else r["kv"]["used"],
            resident_tokens=r["kv"]["resident_tokens"],
            resident_runs=r["kv"]["resident_runs"],
            new_batch_fits=r["kv"]["new_batch_fits"],
            new_interactive_fits=r["kv"]["new_interactive_fits"],
        )
    for g in view["held"]:
        reply.held.add(
            service_class=_CLASS_OUT[m.ServiceClass(g["class"])],
            caller=g["caller"],
            count=g["count"],
            oldest_wait_seconds=g["oldest_wait_s"],
        )
    for phase, by_class in view["runs"].items():
        for cls, count in by_class.items():
            reply.runs.add(
                phase=_PHASE_OUT[m.Phase(phase)],
                service_class=_CLASS_OUT[m.ServiceClass(cls)],
                count=count,
            )
    return reply


def _without_waits(reply: pb.StatusReply) -> bytes:
    """The status as bytes, held turns' oldest waits left out (they change every moment)."""
    copy = pb.StatusReply()
    copy.CopyFrom(reply)
    for group in copy.held:
        group.oldest_wait_seconds = 0.0
    return copy.SerializeToString(deterministic=True)


def open_message(state: m.State) -> pb.OpenReplicas:
    """The open replicas, as the dataplanes are told them."""
    message = pb.OpenReplicas()
    for replica in open_replicas(state):
        message.replicas.add(
            replica_id=replica.id,
            replica_url=replica.url,
            models=sorted(replica.models),
            interactive_priority=replica.engine_priority(m.ServiceClass.INTERACTIVE),
            batch_priority=replica.engine_priority(m.ServiceClass.BATCH),
        )
    return message


def _missing_fields(request: pb.AdmitRequest) -> bool:
    return not request.turn_id or not request.model or not (request.run_id or request.single_pass)


def _admit_event(host: SchedulerHost, request: pb.AdmitRequest) -> e.Admit:
    return e.Admit(
        at=host.now(),
        turn_id=request.turn_id,
        run_id=request.run_id,
        model=request.model,
        service_class=service_class(request.service_class),
        caller=request.caller,
        dataplane=request.dataplane_id,
        single_pass=request.single_pass,
        placed_on="" if request.single_pass else request.placed_replica_id,
        prompt_bytes=max(request.prompt_bytes, 0),
        opening=tuple(
            (key.hash, key.bytes) for key in request.opening[:MAX_OPENING_KEYS] if key.bytes > 0
        ),
    )


def _reply(place: e.Place) -> pb.AdmitReply:
    return pb.AdmitReply(
        turn_id=place.turn_id,
        replica_id=place.replica_id,
        replica_url=place.replica_url,
        held_ms=place.held_s * 1000.0,
        engine_priority=place.engine_priority,
        engine_slot=place.engine_slot,
        slot_save=place.slot_save,
        slot_restore=place.slot_restore,
    )


class _Session:
    """One dataplane's Session stream: applies what comes up, writes placements down.

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
            event = turn_event(item.event, host.now())
            if event is None:
                continue
            if isinstance(event, e.TurnFailed):
                host.metrics.failed_turn(host.state, event.turn_id)
            host.apply(event)

    def _admit(self, request: pb.AdmitRequest) -> None:
        turn_id = request.turn_id
        if _missing_fields(request):
            self._refuse(turn_id, grpc.StatusCode.INVALID_ARGUMENT, _MISSING)
            return
        if turn_id in self._waiting:
            return  # sent twice on this stream; the first admission still waits
        host = self._host
        if request.placed_replica_id and not request.single_pass:
            host.metrics.placed_by_dataplane.inc()
            host.apply(_admit_event(host, request))
            if tracing.enabled():
                spans.reported(request)
            return
        span = spans.start(request) if tracing.enabled() else None
        fut = host.wait_for(turn_id)
        self._waiting[turn_id] = (fut, time.perf_counter())
        fut.add_done_callback(lambda f: self._resolved(turn_id, f))
        host.apply(_admit_event(host, request))
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
        if exc is not None:
            rejected = isinstance(exc, TurnRejected)
            code = grpc.StatusCode.NOT_FOUND if rejected else grpc.StatusCode.INTERNAL
            self._refuse(turn_id, code, str(exc))
            return
        self._host.metrics.admit_seconds.observe(time.perf_counter() - started)
        self._out.put_nowait(pb.Placement(turn_id=turn_id, placed=_reply(fut.result())))

    def _refuse(self, turn_id: str, code: grpc.StatusCode, message: str) -> None:
        refusal = pb.Refusal(code=code.value[0], message=message)
        self._out.put_nowait(pb.Placement(turn_id=turn_id, refused=refusal))

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


_MISSING = "turn_id, run_id and model are required"


class SchedulerService(pb_grpc.SchedulerServicer):
    def __init__(self, host: SchedulerHost) -> None:
        self.host = host
        self._sessions: set[_Session] = set()
        self._open = open_message(host.state)
        host.on_open_changed(self._publish_open)
        host.on_run_taken(self._publish_taken)

    def _publish_taken(self, taken: e.RunTaken) -> None:
        for session in self._sessions:
            if session.dataplane == taken.dataplane:
                session.send_taken(taken.run_id)

    def _publish_open(self, state: m.State) -> None:
        opened = open_message(state)
        if opened == self._open:
            return
        self._open = opened
        for session in self._sessions:
            session.send_open(opened)

    async def Admit(
        self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext
    ) -> pb.AdmitReply:
        started = time.perf_counter()
        if _missing_fields(request):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _MISSING)
        host = self.host
        span = spans.start(request, traceparent_of(context)) if tracing.enabled() else None
        fut = host.wait_for(request.turn_id)
        host.apply(_admit_event(host, request))
        if span is not None:
            spans.admitted(span, host.state, request.turn_id)
        try:
            place = await fut
        except TurnRejected as exc:
            if span is not None:
                spans.refused(span, str(exc))
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except asyncio.CancelledError:
            if span is not None:
                spans.abandoned(span)
            host.give_up(request.turn_id, fut)
            raise
        host.metrics.admit_seconds.observe(time.perf_counter() - started)
        if span is not None:
            spans.placed(span, place)
        return _reply(place)

    async def Session(
        self, request_iterator: AsyncIterator[pb.DataplaneBatch], context: grpc.aio.ServicerContext
    ) -> None:
        host = self.host
        dataplane = dataplane_of(context)
        session = _Session(host, context, dataplane, self._open)
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
        event = resync_event(request, self.host.now())
        self.host.apply(event)
        log.info(
            "resync", dataplane=request.dataplane_id, runs=len(event.runs), turns=len(event.turns)
        )
        return pb.ResyncReply(runs=len(event.runs), turns=len(event.turns))

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsReply:
        state = self.host.state
        reply = pb.ListModelsReply()
        for model in sorted(
            {*state.generative_by_model.keys(), *state.single_pass_by_model.keys()}
        ):
            ids = (
                *state.generative_by_model.get(model, ()),
                *state.single_pass_by_model.get(model, ()),
            )
            reply.models.add(id=model, replica_ids=ids)
        return reply

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusReply:
        return status_reply(self.host)

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
                reply = status_reply(self.host)
                # The held turns' waits grow with the clock: compare the status without them.
                shape = _without_waits(reply)
                if shape != last:
                    last = shape
                    yield reply
                await asyncio.sleep(interval)
                await changed.wait()
        finally:
            self.host.unwatch(changed)
