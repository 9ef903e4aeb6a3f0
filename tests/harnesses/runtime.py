"""What the MCP runtime says of the runs a harness spawned, read as its own clients read it."""

from __future__ import annotations

from typing import Any

import aiohttp
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from luftpause.testkit.harnesses import HarnessStack


async def runs(stack: HarnessStack) -> list[dict[str, Any]]:
    """The runtime's run tree (`GET /status`), roots only."""
    headers = {"Authorization": f"Bearer {stack.token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(stack.runtime + "/status", headers=headers) as resp,
    ):
        resp.raise_for_status()
        tree: list[dict[str, Any]] = (await resp.json())["tree"]
    return tree


async def results(stack: HarnessStack, handles: list[str]) -> list[str]:
    """The finished runs' results, as `await` over MCP gives them."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)
    async with http, Client(streamable_http_client(stack.mcp, http_client=http)) as client:
        done = await client.call_tool("await", {"handles": handles, "timeout": 30})
    assert done.structured_content is not None
    return [str(run["result"]) for run in done.structured_content["runs"]]
