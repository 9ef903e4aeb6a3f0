"""The scheduler's readiness apart from its liveness, as a real process.

Liveness (gRPC health for "" and HTTP `/health`) holds as soon as the server runs; readiness
(gRPC health for `luftpause.v1.Scheduler` and HTTP `/ready`) only once the prober has applied
its first round. The engine here holds its health probe until the test lets it answer, so the
first round lasts exactly as long as the test wants.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from luftpause.testkit.procs import Proc, free_port

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class Slow:
    release: asyncio.Event
    http: str
    health: health_pb2_grpc.HealthStub

    async def grpc_status(self, service: str) -> int:
        reply = await self.health.Check(health_pb2.HealthCheckRequest(service=service))
        return int(reply.status)

    async def get(self, path: str) -> tuple[int, dict[str, object]]:
        async with aiohttp.ClientSession() as s, s.get(self.http + path) as resp:
            return resp.status, await resp.json()


@pytest.fixture
async def slow(tmp_path: Path) -> AsyncIterator[Slow]:
    release = asyncio.Event()

    async def engine_health(_: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/health", engine_health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    engine = free_port()
    await web.TCPSite(runner, "127.0.0.1", engine).start()
    config = tmp_path / "endpoints.yaml"
    config.write_text(
        f"endpoints:\n  - id: a\n    url: http://127.0.0.1:{engine}\n    models: [m]\n"
        "    metrics: ''\n"
    )
    grpc_port, http_port = free_port(), free_port()
    args = ["scheduler", "--config", str(config), "--grpc-port", str(grpc_port)]
    args += ["--http-port", str(http_port), "--probe-period", "30"]
    proc = await Proc(args, log_path=tmp_path / "scheduler.log").start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
    try:
        await proc.wait_http(f"http://127.0.0.1:{http_port}/health")
        yield Slow(release, f"http://127.0.0.1:{http_port}", health_pb2_grpc.HealthStub(channel))
    finally:
        release.set()
        await channel.close()
        assert await proc.stop() == 0
        await runner.cleanup()


async def test_the_scheduler_is_live_at_once_and_ready_once_its_engines_are_probed(
    slow: Slow,
) -> None:
    async with asyncio.timeout(20):
        assert await slow.grpc_status("") == SERVING
        assert await slow.grpc_status("luftpause.v1.Scheduler") == NOT_SERVING
        assert await slow.get("/health") == (200, {"status": "ok"})
        status, body = await slow.get("/ready")
        assert status == 503
        assert "first round of engine probes" in str(body["error"])

        slow.release.set()
        while (await slow.get("/ready"))[0] != 200:
            await asyncio.sleep(0.05)
        assert await slow.get("/ready") == (200, {"status": "ready"})
        while await slow.grpc_status("luftpause.v1.Scheduler") != SERVING:
            await asyncio.sleep(0.05)
        assert await slow.grpc_status("") == SERVING
