"""Fixtures for the dataplane's shell tests: fake scheduler + fake engine + a real dataplane."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web

from luftpause.common.keys import KeysFile
from luftpause.dataplane.app import build_app, start_server
from luftpause.dataplane.context import DATAPLANE, Dataplane, Served
from luftpause.dataplane.transport import AiohttpTransport, EngineTransport
from tests.dataplane.fakes import MODEL, FakeEngine, FakeScheduler, start_engine, start_scheduler

ENGINE_KEY = "engine-secret"


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@dataclass
class Stack:
    scheduler: FakeScheduler
    engine: FakeEngine
    engine_url: str
    grpc_server: grpc.aio.Server
    grpc_port: int
    app: web.Application
    url: str
    http: aiohttp.ClientSession

    @property
    def dp(self) -> Dataplane:
        return self.app[DATAPLANE]

    async def stop_scheduler(self) -> None:
        await self.grpc_server.stop(0)

    async def start_scheduler(self) -> None:
        self.grpc_server, _ = await start_scheduler(self.scheduler, self.grpc_port)

    @staticmethod
    def chat(**extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        body.update(extra)
        return body

    async def post(
        self, body: Any, path: str = "/v1/chat/completions", **headers: str
    ) -> tuple[int, dict[str, str], bytes]:
        """POST a chat completion (or a turn of another API at `path`); status, headers and
        body bytes."""
        kwargs: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
        async with self.http.post(self.url + path, headers=headers, **kwargs) as resp:
            return resp.status, dict(resp.headers), await resp.read()

    async def read_cut(self, path: str, body: Any) -> tuple[bytes, bool]:
        """POST a streamed turn; the bytes it got, and whether the stream was cut off."""
        received = b""
        async with self.http.post(self.url + path, json=body) as resp:
            assert resp.status == 200
            try:
                async for chunk in resp.content.iter_any():
                    received += chunk
            except aiohttp.ClientPayloadError:
                return received, True
        return received, False

    async def turn_events(self, turn_id: str, count: int) -> list[str]:
        """The kinds of the turn's reported events, once `count` of them arrived."""
        await self.scheduler.changes.until(lambda: len(self.scheduler.events_of(turn_id)) >= count)
        return self.scheduler.events_of(turn_id)


@asynccontextmanager
async def running_stack(
    transport_factory: Callable[[], EngineTransport] = AiohttpTransport,
    token: bytes | None = None,
    local_placement: bool = True,
    keys: KeysFile | None = None,
    served: dict[str, Served] | None = None,
) -> AsyncIterator[Stack]:
    engine = FakeEngine()
    engine_runner, engine_url = await start_engine(engine)
    scheduler = FakeScheduler(engine_url)
    server, grpc_port = await start_scheduler(scheduler)
    app = build_app(
        scheduler=f"127.0.0.1:{grpc_port}",
        dataplane_id="dp-test",
        api_keys={"engine-a": ENGINE_KEY},
        transport_factory=transport_factory,
        reconnect_delay=0.05,
        token=token,
        keys=keys,
        local_placement=local_placement,
        served=served,
    )
    runner, port = await start_server(app, "127.0.0.1", 0)
    http = aiohttp.ClientSession()
    s = Stack(
        scheduler=scheduler,
        engine=engine,
        engine_url=engine_url,
        grpc_server=server,
        grpc_port=grpc_port,
        app=app,
        url=f"http://127.0.0.1:{port}",
        http=http,
    )
    try:
        async with asyncio.timeout(5):
            await s.dp.link.wait_ready()
            await scheduler.changes.until(lambda: "session" in scheduler.calls)
        yield s
    finally:
        await http.close()
        await runner.cleanup()
        await s.grpc_server.stop(0)
        await engine_runner.cleanup()


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack() as s:
        yield s


@dataclass
class Lone:
    """A dataplane whose scheduler is not running (yet) on `grpc_port`."""

    app: web.Application
    url: str
    http: aiohttp.ClientSession
    grpc_port: int
    scheduler: FakeScheduler
    grpc_server: grpc.aio.Server | None = None

    @property
    def dp(self) -> Dataplane:
        return self.app[DATAPLANE]

    async def start_scheduler(self) -> None:
        self.grpc_server, _ = await start_scheduler(self.scheduler, self.grpc_port)

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(self.url + path) as resp:
            return resp.status, await resp.json()


@asynccontextmanager
async def lone_dataplane(
    *,
    config_models: tuple[str, ...] | None = None,
    models_hold_seconds: float = 30.0,
    token: bytes | None = None,
) -> AsyncIterator[Lone]:
    """A dataplane started before its scheduler; `start_scheduler` brings a fake one up."""
    grpc_port = closed_port()
    app = build_app(
        scheduler=f"127.0.0.1:{grpc_port}",
        dataplane_id="dp-lone",
        reconnect_delay=0.05,
        token=token,
        config_models=config_models,
        models_hold_seconds=models_hold_seconds,
    )
    runner, port = await start_server(app, "127.0.0.1", 0)
    lone = Lone(
        app=app,
        url=f"http://127.0.0.1:{port}",
        http=aiohttp.ClientSession(),
        grpc_port=grpc_port,
        scheduler=FakeScheduler(),
    )
    try:
        yield lone
    finally:
        await lone.http.close()
        await runner.cleanup()
        if lone.grpc_server is not None:
            await lone.grpc_server.stop(0)
