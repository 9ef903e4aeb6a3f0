"""The runtime against a rate-limited hosted engine (the simulator's --rpm: 429 with
Retry-After) and with an upstream tool server over stdio. Real processes on loopback.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client

import tests.runtime.stdio_tools
from luftpause.testkit.procs import free_port
from luftpause.testkit.stack import SIM_MODEL, LocalStack
from tests.integration.test_runtime import call

pytestmark = pytest.mark.asyncio(loop_scope="module")

# One request a (scaled) minute, 3 s of real time. The test spends the window's request just
# before the run starts, so the run's first turn meets a 429 and must wait it out (the windows are
# fixed, so leaving it to the second turn would race the window's end on a slow machine).
ENGINE_ARGS = ("--rpm", "1", "--time-scale", "20", "--tool-rounds", "1")
STDIO_SERVER = f"{sys.executable} {Path(tests.runtime.stdio_tools.__file__).resolve()}"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def hosted(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[str, Path, str]]:
    workdir: Path = tmp_path_factory.mktemp("runtime-hosted")
    async with AsyncExitStack() as exits:
        # The dataplane passes every 429 on at once: what is tested here is the runtime's own
        # wait (a dataplane's wait is bounded; past it the runtime's turn meets the 429).
        stack = await LocalStack(
            workdir, engine_args=ENGINE_ARGS, engines=1, dataplane_args=("--rate-limit-wait-s", "0")
        ).start(exits)
        await stack.wait_healthy()
        port = free_port()
        args = ["runtime", "--port", str(port), "--dataplane", stack.base_url.removesuffix("/v1")]
        args += ["--mcp-stdio", STDIO_SERVER, "--state-dir", str(workdir / "state")]
        await stack.launcher.spawn("runtime", args, f"http://127.0.0.1:{port}/health")
        yield f"http://127.0.0.1:{port}/mcp", workdir, stack.engine_url(0)


async def test_a_turn_refused_with_429_is_retried_after_retry_after_and_the_run_finishes(
    hosted: tuple[str, Path, str],
) -> None:
    url, workdir, engine = hosted
    async with asyncio.timeout(40), Client(url) as c:
        tools = await call(c, "tools", {})
        await spend_the_window(engine)
        out = await call(c, "run", {"task": "shout it", "maxToolCalls": 1, "timeout": 35})
    assert [t["name"] for t in tools["tools"]] == ["shout", "leave"]
    assert tools["tools"][0]["server"].startswith("stdio:")
    assert out["state"] == "finished" and out["result"] and out["turns"] == 2
    assert out["toolCalls"] == 1 and out["failedToolCalls"] == 0
    lines = (workdir / "runtime.log").read_text().splitlines()
    log = [json.loads(line) for line in lines if line.startswith("{")]
    waits = [e["retry_in"] for e in log if e.get("event") == "turn.rate_limited"]
    assert waits and all(w > 0 for w in waits)
    records = [json.loads(r) for r in (workdir / "state" / "runs.jsonl").read_text().splitlines()]
    [round_] = [r for r in records if r["type"] == "round"]
    assert round_["results"][0]["content"].startswith("SHOUTED ")


async def spend_the_window(engine: str) -> None:
    """Use up the engine's one request of the current window (a 429 means it already is)."""
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    async with (
        aiohttp.ClientSession() as s,
        s.post(engine + "/v1/chat/completions", json=body) as resp,
    ):
        await resp.read()
        assert resp.status in (200, 429), resp.status
