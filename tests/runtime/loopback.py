"""Real servers on 127.0.0.1, in the test's own event loop, for the runtime's unit tests.

`fake_mcp`: the fake MCP tool server (`luftpause.testkit.fakemcp`: lookup, deep_search,
delete_record, charge, set_status) under uvicorn. `engine`: the engine simulator, which answers
/v1/chat/completions as the dataplane does, so a real `Llm` can drive runs through it (with
tools offered it calls the first one `tool_rounds` times, then answers). `runtime_on`: a real
`Runtime` over both, its journal under a directory the test owns. `plane`: a stand-in dataplane
that answers every chat turn "done" at once and records what each request carried. Every wait
is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from aiohttp import web

from luftpause.runtime.journal.file import JournalFile, Store
from luftpause.runtime.loop.llm import Llm
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.loop.upstream import Upstreams
from luftpause.testkit.engine.params import EngineParams, SimParams
from luftpause.testkit.engine.server import RunningServer, serve
from luftpause.testkit.fakemcp.core import CallStats, Latency
from luftpause.testkit.fakemcp.server import FakeMcpConfig, build_server

STARTUP_TIMEOUT = 10.0
# Fast simulated time: a turn takes milliseconds.
FAST = EngineParams(prefill_ms_per_token=0.01, decode_base_ms=1.0, decode_ms_per_seq=0.0)
MODEL = "luftpause-sim"


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeMcp:
    url: str
    stats: CallStats


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: the test runner keeps Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@asynccontextmanager
async def fake_mcp(
    *, lookup: float = 0.0, deep_search: float = 0.0, write: float = 0.0, port: int = 0
) -> AsyncIterator[FakeMcp]:
    """The fake MCP server with fixed tool latencies (seconds; `write`: charge and set_status),
    on `port` (0: any free one)."""
    config = FakeMcpConfig(
        lookup_latency=Latency.fixed(lookup),
        deep_search_latency=Latency.fixed(deep_search),
        write_latency=Latency.fixed(write),
    )
    stats = CallStats()
    app = build_server(config, stats).streamable_http_app(
        streamable_http_path="/mcp", host="127.0.0.1"
    )
    sock = socket.create_server(("127.0.0.1", port))
    bound = sock.getsockname()[1]
    server = _Uvicorn(
        uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=1)
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT):
            while not server.started:
                if serving.done():
                    serving.result()
                await asyncio.sleep(0.01)
        yield FakeMcp(url=f"http://127.0.0.1:{bound}/mcp", stats=stats)
    finally:
        server.should_exit = True
        await serving
        sock.close()


@asynccontextmanager
async def engine(*, tool_rounds: int = 2) -> AsyncIterator[RunningServer]:
    """The engine simulator in fast time, calling the first offered tool `tool_rounds` times."""
    server = await serve(SimParams(engine=FAST, time_scale=1000.0, tool_rounds=tool_rounds))
    try:
        yield server
    finally:
        await server.close()


@asynccontextmanager
async def runtime_on(
    state_dir: Path,
    model_url: str,
    tool_urls: list[str],
    *,
    resume: bool = True,
    connect_timeout: float = 5.0,
    journal: Store | None = None,
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[Runtime]:
    """A `Runtime` with a real journal (the file under `state_dir` unless `journal` is given),
    model client and upstream sessions, its journal replayed unless `resume` is false; stopped
    on exit (without journaling, as a process stop does)."""
    upstreams = Upstreams(tool_urls, connect_timeout=connect_timeout)
    upstreams.start()
    llm = Llm(model_url, timeout=10.0)
    store = JournalFile(state_dir) if journal is None else journal
    runtime = Runtime(store, llm, upstreams, clock=clock)
    if resume:
        runtime.resume()
    try:
        yield runtime
    finally:
        await runtime.stop()
        await upstreams.close()
        await llm.close()


def closed_port() -> int:
    """A loopback port nothing listens on (just released by the OS)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


@dataclass
class Plane:
    """A dataplane's chat completions, models and decide that answer at once and record each
    request's headers (`turns`) and chat body (`bodies`). A chat request takes the first of
    `answers` while there are any, (status, body: JSON or raw text, headers), else a completion
    that says "done"; GET /v1/models lists `models`."""

    url: str = ""
    turns: list[dict[str, str]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    answers: list[tuple[int, Any, dict[str, str]]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)

    async def chat(self, request: web.Request) -> web.Response:
        self.turns.append(dict(request.headers))
        if request.content_type != "application/json":  # as sglang-router refuses it
            return web.json_response({"error": {"message": "not JSON"}}, status=400)
        self.bodies.append(await request.json())
        if self.answers:
            status, body, headers = self.answers.pop(0)
            if isinstance(body, str):
                return web.Response(status=status, text=body, headers=headers)
            return web.json_response(body, status=status, headers=headers)
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": "sim",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "done"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    async def decide(self, request: web.Request) -> web.Response:
        self.turns.append(dict(request.headers))
        return web.json_response({"label": "yes", "probabilities": {"yes": 1.0}})

    async def list_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": self.models})


@asynccontextmanager
async def plane() -> AsyncIterator[Plane]:
    fake = Plane()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.chat)
    app.router.add_post("/v1/decide", fake.decide)
    app.router.add_get("/v1/models", fake.list_models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield fake
    finally:
        await runner.cleanup()
