"""The results of the runs a harness spawned, read as the runtime's own MCP clients read them."""

from __future__ import annotations

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from luftpause.testkit.harnesses import HarnessStack


async def results(stack: HarnessStack, handles: list[str]) -> list[str]:
    """The finished runs' results, as `await` over MCP gives them."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {stack.token}"}, timeout=30)
    async with http, Client(streamable_http_client(stack.mcp, http_client=http)) as client:
        done = await client.call_tool("await", {"handles": handles, "timeout": 30})
    assert done.structured_content is not None
    return [str(run["result"]) for run in done.structured_content["runs"]]
