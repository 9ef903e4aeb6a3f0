"""The runtime's readiness apart from its liveness, as a real process with auth on.

`/health` answers 200 while the process serves; `/ready` answers 200 only while its dataplane
answers its own `/ready` (a stand-in here whose answer the test sets), and neither needs the
bearer token that `/status` and `/mcp` need.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from luftpause.testkit.procs import free_port
from luftpause.testkit.stack import Launcher
from luftpause.testkit.waits import WAIT_SECONDS, eventually, local_url

TOKEN = "tok-" + "r" * 24


@dataclass
class Runtime:
    url: str
    dataplane_ready: list[bool]

    async def get(self, path: str) -> tuple[int, dict[str, object]]:
        async with aiohttp.ClientSession() as s, s.get(self.url + path) as resp:
            return resp.status, await resp.json()


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    ready = [False]

    async def dataplane_ready(_: web.Request) -> web.Response:
        if ready[0]:
            return web.json_response({"status": "ready"})
        message = "scheduler unreachable at 127.0.0.1:1: no session opened yet"
        return web.json_response({"error": {"message": message}}, status=503)

    app = web.Application()
    app.router.add_get("/ready", dataplane_ready)
    runner = web.AppRunner(app, access_log=None)
    async with AsyncExitStack() as exits:
        await runner.setup()
        exits.push_async_callback(runner.cleanup)
        dataplane = free_port()
        await web.TCPSite(runner, "127.0.0.1", dataplane).start()
        port = free_port()
        args = ["runtime", "--port", str(port), "--dataplane", local_url(dataplane)]
        await Launcher(tmp_path, exits).spawn(
            "runtime",
            [*args, "--state-dir", str(tmp_path / "state")],
            local_url(port) + "/health",
            env={"LUFTPAUSE_TOKEN": TOKEN},
        )
        yield Runtime(local_url(port), ready)


async def test_the_runtime_is_ready_only_while_its_dataplane_is(runtime: Runtime) -> None:
    async with asyncio.timeout(2 * WAIT_SECONDS):
        assert await runtime.get("/health") == (200, {"status": "ok"})
        assert (await runtime.get("/status"))[0] == 401
        status, body = await runtime.get("/ready")
        assert status == 503
        message = str(body["error"])
        assert "dataplane not ready" in message and "scheduler unreachable" in message

        runtime.dataplane_ready[0] = True
        await eventually(  # the last answer is kept about a second
            lambda: runtime.get("/ready"),
            lambda got: got[0] == 200,
            "the runtime ready once its dataplane is",
            every=0.1,
        )
        assert await runtime.get("/ready") == (200, {"status": "ready"})

        runtime.dataplane_ready[0] = False
        await eventually(
            lambda: runtime.get("/ready"),
            lambda got: got[0] == 503,
            "the runtime not ready once its dataplane is not",
            every=0.1,
        )
        assert (await runtime.get("/health"))[0] == 200
