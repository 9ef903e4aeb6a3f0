"""Fakes for the dataplane's shell tests: a scheduler gRPC server and a tiny engine.

Both run in the test's event loop on loopback. Every state change wakes `changed`, so tests
wait for a condition (bounded by `asyncio.timeout`) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from multidict import CIMultiDict

from luftpause.dataplane.errors import EngineStreamBroken
from luftpause.rpc import scheduler_pb2 as pb
from luftpause.rpc import scheduler_pb2_grpc as pb_grpc

MODEL = "sim-model"


class Changes:
    """Wake waiters whenever something was recorded."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()

    async def until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            self._event.clear()
            await self._event.wait()


class FakeScheduler(pb_grpc.SchedulerServicer):
    """Places every turn at once on one replica, records what it is told."""

    def __init__(self, replica_url: str = "", replica_id: str = "engine-a") -> None:
        self.replica_url = replica_url
        self.replica_id = replica_id
        self.models = [MODEL]
        self.calls: list[str] = []
        self.admits: list[pb.AdmitRequest] = []
        self.admits_cancelled: list[str] = []
        self.events: list[pb.TurnEvent] = []
        # Items per Report message, in arrival order.
        self.batches: list[int] = []
        self.resyncs: list[pb.ResyncRequest] = []
        self.hold = False
        self.fail_admits = 0
        self.release = asyncio.Event()
        self.changes = Changes()
        self._breakers: list[asyncio.Event] = []
        # Sent first on every Report stream when set, and pushed to open ones by `set_open`.
        self.open: pb.OpenReplicas | None = None
        self._outs: list[asyncio.Queue[pb.PlacementBatch]] = []

    def take(self, *run_ids: str) -> None:
        """Tell every open Report stream that another dataplane took these runs."""
        for out in self._outs:
            out.put_nowait(pb.PlacementBatch(taken_runs=run_ids))

    def set_open(self, *replicas: pb.OpenReplica) -> None:
        """Tell every open Report stream (and later ones) which replicas are open."""
        self.open = pb.OpenReplicas(replicas=replicas)
        for out in self._outs:
            out.put_nowait(pb.PlacementBatch(open=self.open))

    def events_of(self, turn_id: str) -> list[str]:
        return [e.WhichOneof("kind") or "" for e in self.events if e.turn_id == turn_id]

    def break_sessions(self) -> None:
        for breaker in self._breakers:
            breaker.set()

    def _record(self, call: str) -> None:
        self.calls.append(call)
        self.changes.notify()

    def _place(self, request: pb.AdmitRequest) -> pb.Placement:
        if request.model not in self.models:
            refusal = pb.Refusal(
                code=grpc.StatusCode.NOT_FOUND.value[0],
                message=f"no Generative replica serves model '{request.model}'",
            )
            return pb.Placement(turn_id=request.turn_id, refused=refusal)
        reply = pb.AdmitReply(
            turn_id=request.turn_id, replica_id=self.replica_id, replica_url=self.replica_url
        )
        return pb.Placement(turn_id=request.turn_id, placed=reply)

    async def Report(self, request_iterator: Any, context: Any) -> None:
        """Places each admission at once (or on `release` while `hold`); `fail_admits` breaks
        the stream at the next admissions, as a scheduler going away would."""
        self._record("session")
        breaker = asyncio.Event()
        self._breakers.append(breaker)
        held: dict[str, pb.AdmitRequest] = {}
        out: asyncio.Queue[pb.PlacementBatch] = asyncio.Queue()
        if self.open is not None:
            out.put_nowait(pb.PlacementBatch(open=self.open))
        self._outs.append(out)

        async def consume() -> None:
            async for batch in request_iterator:
                self.batches.append(len(batch.items))
                for item in batch.items:
                    if item.HasField("event"):
                        self.events.append(item.event)
                        if item.event.HasField("abandoned") and item.event.turn_id in held:
                            del held[item.event.turn_id]
                            self.admits_cancelled.append(item.event.turn_id)
                        continue
                    self.admits.append(item.admit)
                    self._record("admit")
                    if item.admit.placed_replica_id:
                        continue  # placed by the dataplane: nothing to answer
                    if self.fail_admits > 0:
                        self.fail_admits -= 1
                        breaker.set()
                        return
                    if self.hold:
                        held[item.admit.turn_id] = item.admit
                    else:
                        out.put_nowait(pb.PlacementBatch(placements=[self._place(item.admit)]))
                self.changes.notify()

        async def release() -> None:
            await self.release.wait()
            for request in held.values():
                out.put_nowait(pb.PlacementBatch(placements=[self._place(request)]))
            held.clear()

        async def write() -> None:
            while True:
                await context.write(await out.get())

        tasks = [asyncio.create_task(t()) for t in (consume, release, write)]
        breaking = asyncio.create_task(breaker.wait())
        await asyncio.wait({tasks[0], breaking}, return_when=asyncio.FIRST_COMPLETED)
        for task in (*tasks, breaking):
            task.cancel()
        self._outs.remove(out)
        self.admits_cancelled.extend(held)
        self.changes.notify()
        if breaker.is_set():
            self._record("session-broken")
            await context.abort(grpc.StatusCode.UNAVAILABLE, "scheduler restarting")

    async def Resync(self, request: pb.ResyncRequest, context: Any) -> pb.ResyncReply:
        self.resyncs.append(request)
        self._record("resync")
        return pb.ResyncReply(runs=len(request.runs), turns=len(request.turns))

    async def ListModels(self, request: Any, context: Any) -> pb.ListModelsReply:
        return pb.ListModelsReply(
            models=[pb.ModelInfo(id=m, replica_ids=[self.replica_id]) for m in self.models]
        )


async def start_scheduler(fake: FakeScheduler, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServicer_to_server(fake, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


def sse(*chunks: dict[str, Any], done: bool = True) -> list[bytes]:
    """Chat completion chunks as SSE events, each its own write."""
    out = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


def delta_chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


TEXT_STREAM = sse(
    delta_chunk({"role": "assistant", "content": ""}),
    delta_chunk({"content": "Hello"}),
    delta_chunk({"content": " world"}),
    delta_chunk({}, "stop"),
    usage_chunk(12, 2, 8),
)

TOOL_STREAM = sse(
    delta_chunk({"role": "assistant", "content": None}),
    delta_chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": ""},
                }
            ]
        }
    ),
    delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": "x"}'}}]}),
    delta_chunk({}, "tool_calls"),
    usage_chunk(20, 7, 0),
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    headers: dict[str, str]
    body: bytes
    peer: tuple[str, int]
    path: str = "/v1/chat/completions"
    query: str = ""


@dataclass
class FakeEngine:
    """An OpenAI-compatible engine that streams `chunks` (or answers via `handler`)."""

    chunks: list[bytes] = field(default_factory=lambda: list(TEXT_STREAM))
    handler: Handler | None = None
    seen: list[Seen] = field(default_factory=list)
    disconnects: int = 0
    changes: Changes = field(default_factory=Changes)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else ("", 0)
        self.seen.append(
            Seen(dict(request.headers), body, peer, request.path, request.query_string)
        )
        self.changes.notify()
        try:
            if self.handler is not None:
                return await self.handler(request)
            return await self.stream(request)
        except (asyncio.CancelledError, ConnectionError):
            self.disconnects += 1
            self.changes.notify()
            raise

    async def stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in self.chunks:
            await resp.write(chunk)
        await resp.write_eof()
        return resp


async def start_engine(engine: FakeEngine) -> tuple[web.AppRunner, str]:
    app = web.Application()
    # One handler for every API it may be said to serve (`Served.apis`): the test says what
    # it answers (`chunks`, `handler`) and reads where each request went (`Seen.path`).
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
        app.router.add_post(path, engine.handle)
    app.router.add_post("/v1/messages/count_tokens", engine.handle)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@dataclass
class MemoryResponse:
    """A scripted engine reply for `MemoryTransport`; `break_after` chunks, then it breaks."""

    status: int = 200
    headers: CIMultiDict[str] = field(
        default_factory=lambda: CIMultiDict({"Content-Type": "text/event-stream"})
    )
    chunks: list[bytes] = field(default_factory=lambda: list(TEXT_STREAM))
    break_after: int | None = None
    closed: bool = False

    async def read_chunk(self) -> bytes:
        if self.break_after is not None and self.break_after == 0:
            raise EngineStreamBroken("connection reset by peer")
        if self.break_after is not None:
            self.break_after -= 1
        return self.chunks.pop(0) if self.chunks else b""

    async def read(self) -> bytes:
        data = b""
        while chunk := await self.read_chunk():
            data += chunk
        return data

    def close(self) -> None:
        self.closed = True


@dataclass
class MemoryTransport:
    """An in-memory engine behind the `EngineTransport` protocol."""

    reply: Callable[[str, Mapping[str, str], bytes], MemoryResponse]
    sent: list[tuple[str, Mapping[str, str], bytes]] = field(default_factory=list)
    responses: list[MemoryResponse] = field(default_factory=list)

    async def send(self, url: str, headers: Mapping[str, str], body: bytes) -> MemoryResponse:
        self.sent.append((url, headers, body))
        response = self.reply(url, headers, body)
        self.responses.append(response)
        return response

    async def close(self) -> None:
        return None
