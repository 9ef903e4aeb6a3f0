"""The official `mcp` Python client (Streamable HTTP) on each protocol version the runtime serves:
2025-11-25 through the initialize handshake, with an MCP session, and 2026-07-28 (pinned, or as
the client's default mode finds it) without a handshake or a session: every request stands
alone. The stack is `test_runtime`'s fixture.

The runtime names the caller of a run's turns (fairness between callers) after the MCP session
when there is one, and after the client's name when there is none.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.types import Implementation

from tests.integration.test_runtime import RuntimeStack, call, rt

pytestmark = pytest.mark.asyncio(loop_scope="module")
__all__ = ["rt"]

ME = Implementation(name="versions-test", version="1.0")


def spawned_spec(rt: RuntimeStack, handle: str) -> dict[str, Any]:
    lines = (rt.workdir / "state" / "runs.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    [spec] = [r["spec"] for r in records if r["type"] == "spawned" and r["run"] == handle]
    return spec


@pytest.mark.parametrize(
    ("mode", "version"),
    [("legacy", "2025-11-25"), ("2026-07-28", "2026-07-28"), ("auto", "2026-07-28")],
    ids=["legacy", "pinned", "auto"],
)
async def test_spawn_and_await_work_on_each_protocol_version(
    rt: RuntimeStack, mode: str, version: str
) -> None:
    async with asyncio.timeout(30), Client(rt.mcp_url, mode=mode, client_info=ME) as c:
        assert c.protocol_version == version
        names = {t.name for t in (await c.list_tools()).tools}
        handles = [
            (
                await call(
                    c, "spawn", {"task": f"river {i}", "tools": ["lookup"], "maxToolCalls": 1}
                )
            )["handle"]
            for i in range(2)
        ]
        out = await call(c, "await", {"handles": handles, "timeout": 25})
    assert names >= {"spawn", "await", "run", "status", "cancel", "approve", "tools", "decide"}
    runs = out["runs"]
    assert [r["handle"] for r in runs] == handles
    assert all(r["state"] == "finished" and r["toolCalls"] == 1 for r in runs), runs
    callers = {spawned_spec(rt, h)["caller"] for h in handles}
    if mode == "legacy":  # one session: its id is the caller of both runs
        assert len(callers) == 1 and not callers.pop().startswith("mcp:")
    else:  # no session: the client's name is
        assert callers == {"mcp:versions-test"}


async def test_an_older_handshake_version_is_answered_in_kind(rt: RuntimeStack) -> None:
    """A client that offers 2025-06-18 in initialize gets 2025-06-18 back (the SDK serves every
    handshake version from 2024-11-05 on)."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "old-client", "version": "0"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream"}
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as s,
        s.post(rt.mcp_url, json=body, headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()
        text = await resp.text()
    if resp.content_type == "text/event-stream":
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    assert json.loads(text)["result"]["protocolVersion"] == "2025-06-18"
