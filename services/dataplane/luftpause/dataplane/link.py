"""The dataplane's connection to the scheduler: the Report stream, Resync, ListModels.

Shell module: owns the gRPC channel and one background task; maps gRPC errors to
`errors` at this boundary.

Theory of operation
-------------------
One background task keeps a *session* up. A session is: snapshot the run table and drop every
item still queued (the snapshot supersedes them), send `Resync` with the snapshot, open the
bidirectional `Report` call, queue every admission still waiting (in arrival order), mark the
link ready, then write queued items to it in order until it breaks, while a reader resolves the
placements that come back. Items that queued while a write was in flight go out together as one
message. A break is the call ending or a failed write or read. After a break the link is not
ready, the task waits `reconnect_delay` (1 s) and starts a new session, for as long as the
process lives.

Events lost in a break (queued, or written but not delivered) are not resent: the `Resync`
that opens the next session carries the state they would have produced (runs with their phase
and replica, turns in flight), which is what the scheduler keeps. Usage of a turn that finished
during the outage is the one fact not carried. Admissions are never lost: one waits, under its
turn id, until a placement or a refusal for it arrives, through any number of sessions (the
scheduler drops a stream's held turns when the stream ends, and placing a turn twice under one
id gives the same replica). Cancelling `admit` forgets it here; the turn's `abandoned` event,
on the same ordered stream, withdraws it at the scheduler.

The scheduler also sends, first on every stream and whenever it changes, the list of open
replicas (see `local`). The link keeps the newest list while the session is up and forgets it
the moment the session breaks: with the scheduler out of reach every turn waits, as before.
A turn placed on an open replica is reported with `placed` as an admission that names its
replica, sent within a few milliseconds and always before the turn's own events; the end of a
turn on an open replica waits as long at most (it frees nothing anyone waits for). A run the
scheduler says another dataplane took is dropped from the run table, so its next turn here is
asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TypeAlias

import grpc
import structlog

from luftpause.dataplane import wire
from luftpause.dataplane.errors import (
    ModelNotFound,
    RateLimited,
    SchedulerError,
    SchedulerUnavailable,
)
from luftpause.dataplane.local import OpenReplica, by_model
from luftpause.dataplane.runs import RunTable
from luftpause.rpc import scheduler_pb2 as pb
from luftpause.rpc import scheduler_pb2_grpc as pb_grpc

RECONNECT_SECONDS = 1.0
# The scheduler releases a dataplane's turns once all its Report streams are gone a while.
DATAPLANE_METADATA = "x-luftpause-dataplane"
RPC_TIMEOUT_SECONDS = 5.0
CLOSE_TIMEOUT_SECONDS = 2.0
# Items per Report message at most; a message stays far below gRPC's 4 MiB default limit.
MAX_ITEMS_PER_WRITE = 512
# How long an event that changes no decision may wait for company before it is sent alone.
LAZY_FLUSH_SECONDS = 0.5
# How long the placement or the end of a turn on an open replica may go unreported (the
# scheduler's counts lag by this much at most; its probes see the engines every 2 s).
PLACED_FLUSH_SECONDS = 0.005
_LAZY = frozenset({"started", "first_token"})
# What a call's status says when the scheduler was not reached (or did not answer in time).
_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_WAKE = pb.DataplaneItem()  # wakes the writer to send the lazy events; never sent itself

# The channel's own reconnect backoff grows to minutes by default; hold it at our 1 s pace.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 1000),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

log = structlog.get_logger("luftpause.dataplane.link")

_ReportCall: TypeAlias = "grpc.aio.StreamStreamCall[pb.DataplaneBatch, pb.PlacementBatch]"


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
        self._queue: asyncio.Queue[pb.DataplaneItem | None] = asyncio.Queue()
        self._ready = asyncio.Event()
        self._waiting: dict[str, tuple[pb.AdmitRequest, asyncio.Future[wire.Placement]]] = {}
        self._lazy: list[pb.DataplaneItem] = []
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._open: dict[str, tuple[OpenReplica, ...]] = {}
        self._open_ids: frozenset[str] = frozenset()
        self._closing = False
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SchedulerStub | None = None
        self._task: asyncio.Task[None] | None = None
        self._down_reason = "no session opened yet"
        self._sessions = 0

    @property
    def ready(self) -> bool:
        """True while a session is up (resynced, Report open)."""
        return self._ready.is_set()

    @property
    def ever_up(self) -> bool:
        """A session has been up since this link started."""
        return self._sessions > 0

    @property
    def sessions(self) -> int:
        """Report streams that came up since this link started (the metrics' reconnects)."""
        return self._sessions

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

    def report(self, event: pb.TurnEvent, replica_id: str = "") -> None:
        """Queue an event of a turn on `replica_id` (if placed) for the stream; never blocks.

        `started` and `first_token` change no decision at the scheduler: they wait for the next
        write (or `LAZY_FLUSH_SECONDS`) instead of costing a stream message each. The end of a
        turn on an open replica frees no slot anyone waits for (nothing is held for an open
        replica), so it waits `PLACED_FLUSH_SECONDS` at most, for company. Whatever waits goes
        out ahead of the next write's other items, so the order of a turn's items holds.
        """
        item = pb.DataplaneItem(event=event)
        if event.WhichOneof("kind") in _LAZY:
            self._defer(item, LAZY_FLUSH_SECONDS)
        elif replica_id and replica_id in self._open_ids:
            self._defer(item, PLACED_FLUSH_SECONDS)
        else:
            self._queue.put_nowait(item)

    def _defer(self, item: pb.DataplaneItem, within: float) -> None:
        """Send `item` with the next write, and in `within` seconds at the latest."""
        self._lazy.append(item)
        loop = asyncio.get_running_loop()
        due = loop.time() + within
        timer = self._lazy_timer
        if timer is not None:
            if timer.when() <= due:
                return
            timer.cancel()
        self._lazy_timer = loop.call_at(due, self._flush_lazy)

    def open_for(self, model: str) -> tuple[OpenReplica, ...]:
        """The open replicas serving `model`, as the scheduler last said; none while down."""
        return self._open.get(model, ())

    def _set_open(self, replicas: Sequence[OpenReplica]) -> None:
        self._open = by_model(replicas)
        self._open_ids = frozenset(r.replica_id for r in replicas)

    def placed(self, request: pb.AdmitRequest) -> None:
        """Report a turn this dataplane placed itself (`wire.placed_here`); never blocks.

        The report waits up to `PLACED_FLUSH_SECONDS` for company (the turn's own end, for a
        short one), so its stream write does not compete with the turn's request to the engine.
        """
        self._defer(pb.DataplaneItem(admit=request), PLACED_FLUSH_SECONDS)

    def _flush_lazy(self) -> None:
        self._lazy_timer = None
        if self._lazy:
            self._queue.put_nowait(_WAKE)

    async def admit(self, request: pb.AdmitRequest) -> wire.Placement:
        """Wait until the scheduler places the turn; hold through outages."""
        turn_id = request.turn_id
        fut: asyncio.Future[wire.Placement] = asyncio.get_running_loop().create_future()
        self._waiting[turn_id] = (request, fut)
        if self.ready:
            self._queue.put_nowait(pb.DataplaneItem(admit=request))
        try:
            return await fut
        finally:
            if self._waiting.get(turn_id, (None, None))[1] is fut:
                del self._waiting[turn_id]

    async def list_models(self, timeout: float = RPC_TIMEOUT_SECONDS) -> list[str]:
        """Model ids the scheduler serves; `SchedulerUnavailable` when it cannot be reached."""
        try:
            reply = await self._require_stub().ListModels(pb.ListModelsRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
            if exc.code() in _UNREACHABLE:
                raise SchedulerUnavailable(reason) from exc
            raise SchedulerError(f"scheduler: {reason}") from exc
        return [m.id for m in reply.models]

    @property
    def down_reason(self) -> str:
        """Why no session is up: the last error seen, or that none was opened yet."""
        return self._down_reason

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
                self._down_reason = f"{exc.code().name}: {exc.details()}"
            except Exception as exc:  # a write on a finished call, and the like
                log.warning("scheduler link down", error=repr(exc))
                self._down_reason = repr(exc)
            else:
                self._down_reason = "the scheduler ended the session"
            self._ready.clear()
            if not self._closing:
                await asyncio.sleep(self._reconnect_delay)

    async def _session(self) -> None:
        stub = self._require_stub()
        snapshot = self._runs.snapshot(self._clock())
        dropped = self._drop_queued()
        reply = await stub.Resync(
            wire.resync_request(snapshot, self.dataplane_id), timeout=RPC_TIMEOUT_SECONDS
        )
        call = stub.Report(metadata=((DATAPLANE_METADATA, self.dataplane_id),))
        try:
            await call.wait_for_connection()
            for request, _ in self._waiting.values():
                self._queue.put_nowait(pb.DataplaneItem(admit=request))
            self._ready.set()
            self._sessions += 1
            log.info(
                "scheduler link up",
                target=self.target,
                runs=reply.runs,
                turns=reply.turns,
                held=len(self._waiting),
                superseded_events=dropped,
            )
            await self._until_broken(call)
        finally:
            self._ready.clear()
            self._set_open(())
            call.cancel()
            if self._waiting and not self._closing:
                log.warning("scheduler link down: holding turns", held=len(self._waiting))

    async def _until_broken(self, call: _ReportCall) -> None:
        tasks = {
            asyncio.create_task(self._pump(call)),
            asyncio.create_task(self._read(call)),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            task.result()

    async def _pump(self, call: _ReportCall) -> None:
        queue = self._queue
        while True:
            item = await queue.get()
            # Whatever queued while the last write was in flight goes out as one message, after
            # the lazy events (each of those is older than its turn's next urgent one).
            batch = pb.DataplaneBatch(items=self._lazy)
            self._lazy = []
            while item is not None:
                if item is not _WAKE:
                    batch.items.append(item)
                if queue.empty() or len(batch.items) >= MAX_ITEMS_PER_WRITE:
                    break
                item = queue.get_nowait()
            if batch.items:
                await call.write(batch)
            if item is None:
                await call.done_writing()
                await asyncio.Event().wait()  # the session ends when the reader sees the end

    async def _read(self, call: _ReportCall) -> None:
        async for batch in call:
            if batch.HasField("open"):
                self._set_open(wire.open_replicas(batch.open))
            for run_id in batch.taken_runs:
                self._runs.end_run(run_id)  # another dataplane serves it now
            for placement in batch.placements:
                self._resolve(placement)
        if not self._closing:
            log.warning("scheduler ended the Report stream")

    def _resolve(self, placement: pb.Placement) -> None:
        entry = self._waiting.get(placement.turn_id)
        if entry is None or entry[1].done():
            return  # withdrawn meanwhile; its abandoned event ends it at the scheduler
        fut = entry[1]
        if placement.HasField("placed"):
            fut.set_result(wire.placement(placement.placed))
            return
        refused = placement.refused
        if refused.code == grpc.StatusCode.NOT_FOUND.value[0]:
            fut.set_exception(ModelNotFound(refused.message))
        elif refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]:
            fut.set_exception(RateLimited(refused.message, refused.retry_after_seconds))
        else:
            fut.set_exception(SchedulerError(f"scheduler: {refused.message}"))

    def _drop_queued(self) -> int:
        dropped = len(self._lazy)
        self._lazy = []
        while not self._queue.empty():
            if self._queue.get_nowait() is not None:
                dropped += 1
        if self._closing:
            self._queue.put_nowait(None)
        return dropped
