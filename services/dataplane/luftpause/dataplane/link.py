"""The dataplane's connection to the scheduler: Admit, the Report stream, Resync, ListModels.

Shell module: owns the gRPC channel and one background task; maps gRPC errors to
`errors` at this boundary.

Theory of operation
-------------------
One background task keeps a *session* up. A session is: snapshot the run table and drop every
event still queued (the snapshot supersedes them), send `Resync` with the snapshot, open the
client-streaming `Report` call, mark the link ready, then write queued events to it in order
until it breaks. A break is the call ending, a failed write, or an Admit that found the
scheduler unreachable (the link is then *suspect*: the next Admit must not reach a restarted
scheduler before it has been resynced). After a break the link is not ready, the task waits
`reconnect_delay` (1 s) and starts a new session, for as long as the process lives.

Events lost in a break (queued, or written but not delivered) are not resent: the `Resync`
that opens the next session carries the state they would have produced (runs with their phase
and replica, turns in flight), which is what the scheduler keeps. Usage of a turn that finished
during the outage is the one fact not carried.

`admit` waits until the link is ready, then calls `Admit`. An unreachable scheduler
(UNAVAILABLE, DEADLINE_EXCEEDED, ...) makes it wait `reconnect_delay` and the next session,
then retry under the same turn id, until it succeeds or its caller is cancelled. Cancelling
`admit` cancels the gRPC call, which removes the held turn at the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import grpc
import structlog

from luftpause.dataplane import wire
from luftpause.dataplane.errors import ModelNotFound, SchedulerError, SchedulerUnavailable
from luftpause.dataplane.runs import RunTable
from luftpause.rpc import scheduler_pb2 as pb
from luftpause.rpc import scheduler_pb2_grpc as pb_grpc

RECONNECT_SECONDS = 1.0
# The scheduler releases a dataplane's turns once all its Report streams are gone a while.
DATAPLANE_METADATA = "x-luftpause-dataplane"
RPC_TIMEOUT_SECONDS = 5.0
CLOSE_TIMEOUT_SECONDS = 2.0

# Codes that mean "not reachable right now", not "no": the turn stays held and is retried.
_UNREACHABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
    }
)
# The channel's own reconnect backoff grows to minutes by default; hold it at our 1 s pace.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 1000),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

log = structlog.get_logger("luftpause.dataplane.link")


class SchedulerLink:
    """Admit turns, report their events, resync after every (re)connect."""

    def __init__(
        self,
        *,
        target: str,
        dataplane_id: str,
        runs: RunTable,
        clock: Callable[[], float] = time.monotonic,
        reconnect_delay: float = RECONNECT_SECONDS,
    ) -> None:
        self.target = target
        self.dataplane_id = dataplane_id
        self._runs = runs
        self._clock = clock
        self._reconnect_delay = reconnect_delay
        self._queue: asyncio.Queue[pb.TurnEvent | None] = asyncio.Queue()
        self._ready = asyncio.Event()
        self._suspect = asyncio.Event()
        self._closing = False
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SchedulerStub | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        """True while a session is up (resynced, Report open)."""
        return self._ready.is_set()

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def start(self) -> None:
        """Open the channel and start keeping a session up."""
        self._channel = grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
        self._stub = pb_grpc.SchedulerStub(self._channel)
        self._task = asyncio.create_task(self._maintain(), name="scheduler-link")

    async def close(self) -> None:
        """Send what is queued (briefly, if the link is up), end the stream, close the channel."""
        self._closing = True
        if self._task is not None:
            if self.ready:
                self._queue.put_nowait(None)
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    async with asyncio.timeout(CLOSE_TIMEOUT_SECONDS):
                        await asyncio.shield(self._task)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._channel is not None:
            await self._channel.close()

    def report(self, event: pb.TurnEvent) -> None:
        """Queue an event for the Report stream; never blocks."""
        self._queue.put_nowait(event)

    async def admit(self, request: pb.AdmitRequest) -> pb.AdmitReply:
        """Wait until the scheduler places the turn; hold through outages."""
        while True:
            await self._ready.wait()
            try:
                reply: pb.AdmitReply = await self._require_stub().Admit(request)
                return reply
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.NOT_FOUND:
                    raise ModelNotFound(
                        exc.details() or f"no Generative replica serves model '{request.model}'"
                    ) from exc
                if code not in _UNREACHABLE:
                    raise SchedulerError(f"scheduler: {code.name}: {exc.details()}") from exc
                log.warning(
                    "admit: scheduler unreachable, holding", turn_id=request.turn_id, code=code.name
                )
                self._ready.clear()
                self._suspect.set()
            await asyncio.sleep(self._reconnect_delay)

    async def list_models(self) -> list[str]:
        """Model ids served by generative replicas, from the scheduler."""
        try:
            reply = await self._require_stub().ListModels(
                pb.ListModelsRequest(), timeout=RPC_TIMEOUT_SECONDS
            )
        except grpc.aio.AioRpcError as exc:
            raise SchedulerUnavailable(f"scheduler: {exc.code().name}: {exc.details()}") from exc
        return [m.id for m in reply.models]

    def _require_stub(self) -> pb_grpc.SchedulerStub:
        if self._stub is None:
            raise SchedulerUnavailable("scheduler link not started")
        return self._stub

    async def _maintain(self) -> None:
        while not self._closing:
            try:
                await self._session()
            except grpc.aio.AioRpcError as exc:
                log.warning("scheduler link down", code=exc.code().name, details=exc.details())
            except Exception as exc:  # a write on a finished call, and the like
                log.warning("scheduler link down", error=repr(exc))
            self._ready.clear()
            if not self._closing:
                await asyncio.sleep(self._reconnect_delay)

    async def _session(self) -> None:
        stub = self._require_stub()
        self._suspect.clear()
        snapshot = self._runs.snapshot(self._clock())
        dropped = self._drop_queued()
        reply = await stub.Resync(
            wire.resync_request(snapshot, self.dataplane_id), timeout=RPC_TIMEOUT_SECONDS
        )
        call = stub.Report(metadata=((DATAPLANE_METADATA, self.dataplane_id),))
        try:
            await call.wait_for_connection()
            self._ready.set()
            log.info(
                "scheduler link up",
                target=self.target,
                runs=reply.runs,
                turns=reply.turns,
                superseded_events=dropped,
            )
            await self._until_broken(call)
        finally:
            self._ready.clear()
            call.cancel()

    async def _until_broken(self, call: grpc.aio.StreamUnaryCall) -> None:
        tasks = {
            asyncio.create_task(self._pump(call)),
            asyncio.create_task(self._ended(call)),
            asyncio.create_task(self._suspect.wait()),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            task.result()

    async def _pump(self, call: grpc.aio.StreamUnaryCall) -> None:
        while True:
            event = await self._queue.get()
            if event is None:
                await call.done_writing()
                await call
                return
            await call.write(event)

    async def _ended(self, call: grpc.aio.StreamUnaryCall) -> None:
        await call
        if not self._closing:
            log.warning("scheduler ended the Report stream")

    def _drop_queued(self) -> int:
        dropped = 0
        while not self._queue.empty():
            if self._queue.get_nowait() is not None:
                dropped += 1
        if self._closing:
            self._queue.put_nowait(None)
        return dropped
