"""LUFTPAUSE_TOKEN across the runtime and the dataplane, with real processes.

With the token set on both: an MCP client without the bearer is refused (401 JSON) on /mcp and
/status, one with it is served; the runtime's sub-agents reach the dataplane, which proves the
runtime sends the same bearer there (the dataplane refuses every /v1 call without it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from luftpause.testkit.stack import LocalStack, start_runtime

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOKEN = "tok-" + "x" * 24


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def runtime_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A stack whose dataplane and runtime both hold the token; the runtime's base URL."""
    work: Path = tmp_path_factory.mktemp("runtime-auth")
    secured = {"LUFTPAUSE_TOKEN": TOKEN}
    async with AsyncExitStack() as exits:
        stack = LocalStack(
            work,
            engine_args=("--time-scale", "20", "--tool-rounds", "1"),
            engines=1,
            with_dataplane=False,
        )
        await stack.start(exits)
        await stack.wait_healthy()
        dataplane = await stack.launcher.dataplane(stack.scheduler, env=secured)
        runtime = await start_runtime(exits, work, dataplane.url, env=secured)
        yield runtime.url


async def test_runtime_refuses_requests_without_the_bearer(runtime_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for path in ("/mcp", "/status"):
            async with s.get(runtime_url + path) as resp:
                assert resp.status == 401
                assert resp.headers["WWW-Authenticate"] == "Bearer"
                assert (await resp.json())["error"]["message"]
            async with s.get(runtime_url + path, headers={"Authorization": "Bearer nope"}) as resp:
                assert resp.status == 401
        async with s.get(
            runtime_url + "/status", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as resp:
            assert resp.status == 200


async def test_sub_agent_runs_through_a_dataplane_that_requires_the_same_bearer(
    runtime_url: str,
) -> None:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    transport = streamable_http_client(runtime_url + "/mcp", http_client=http)
    async with http, asyncio.timeout(60), Client(transport) as client:
        result = await client.call_tool("run", {"task": "How long is the Danube?"})
    assert not result.is_error, result.content
    data: Any = result.structured_content
    assert data is not None
    runs = data.get("runs") or [data]
    assert all(r["state"] == "finished" for r in runs), runs
    assert sum(r["toolCalls"] for r in runs) == 1
