"""Keys per caller across the runtime and the dataplane, with real processes.

One keys file (`LUFTPAUSE_KEYS_FILE`) for both: team-a may use interactive, team-b only batch,
and the runtime's own key (`LUFTPAUSE_RUNTIME_KEY`) acts for others but may itself use only
batch. So an interactive run of team-a's finishes only if its turns reach the dataplane on
behalf of team-a, not as the runtime.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest
import pytest_asyncio
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from luftpause.common.keys import hash_key
from luftpause.testkit.stack import LocalStack, start_runtime

pytestmark = pytest.mark.asyncio(loop_scope="module")
KEYS = {"team-a": "a-" + "k" * 30, "team-b": "b-" + "k" * 30, "runtime": "rt-" + "k" * 30}
CLASSES = {"team-a": ["interactive", "batch"], "team-b": ["batch"], "runtime": ["batch"]}


@dataclass(frozen=True)
class Keyed:
    runtime_url: str
    dataplane_url: str
    journal: Path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def keyed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Keyed]:
    work: Path = tmp_path_factory.mktemp("runtime-keys")
    entries = [
        {"name": name, "sha256": hash_key(key), "classes": CLASSES[name]}
        | ({"acts_for": True} if name == "runtime" else {})
        for name, key in KEYS.items()
    ]
    keys_file = work / "keys.yaml"
    keys_file.write_text(yaml.safe_dump({"keys": entries}))
    env = {"LUFTPAUSE_KEYS_FILE": str(keys_file), "LUFTPAUSE_TOKEN": ""}
    async with AsyncExitStack() as exits:
        stack = LocalStack(
            work,
            engine_args=("--time-scale", "20", "--tool-rounds", "1"),
            engines=1,
            with_dataplane=False,
        )
        await stack.start(exits)
        await stack.wait_healthy()
        dataplane = await stack.launcher.dataplane(stack.scheduler, env=env)
        runtime_env = env | {"LUFTPAUSE_RUNTIME_KEY": KEYS["runtime"]}
        runtime = await start_runtime(exits, work, dataplane.url, env=runtime_env)
        yield Keyed(runtime.url, dataplane.url, work / "runtime-state" / "runs.jsonl")


async def call(url: str, key: str, tool: str, args: dict[str, Any]) -> CallToolResult:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    transport = streamable_http_client(url + "/mcp", http_client=http)
    async with http, asyncio.timeout(60), Client(transport) as client:
        return await client.call_tool(tool, args)


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def test_a_keys_sub_agent_runs_on_its_behalf_and_is_journaled_by_name(keyed: Keyed) -> None:
    result = await call(keyed.runtime_url, KEYS["team-a"], "run", {"task": "Danube length?"})
    assert not result.is_error, text(result)
    data: Any = result.structured_content
    assert data["state"] == "finished", data
    spawned = [json.loads(line) for line in keyed.journal.read_text().splitlines()]
    keys = {r["spec"].get("key") for r in spawned if r["type"] == "spawned"}
    assert keys == {"team-a"}
    assert all(key not in keyed.journal.read_text() for key in KEYS.values())


async def test_a_class_the_key_may_not_use_refuses_the_spawn(keyed: Keyed) -> None:
    result = await call(keyed.runtime_url, KEYS["team-b"], "spawn", {"task": "x"})
    assert result.is_error
    assert "key 'team-b' may not use class 'interactive'" in text(result)


async def test_unknown_keys_are_refused_at_both_doors_and_a_class_at_the_dataplane(
    keyed: Keyed,
) -> None:
    chat = {"model": "luftpause-sim", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s, asyncio.timeout(30):
        async with s.get(
            keyed.runtime_url + "/status", headers={"Authorization": "Bearer nope"}
        ) as resp:
            assert resp.status == 401
        async with s.post(
            keyed.dataplane_url + "/v1/chat/completions",
            json=chat,
            headers={"Authorization": "Bearer nope"},
        ) as resp:
            assert resp.status == 401
        async with s.post(
            keyed.dataplane_url + "/v1/chat/completions",
            json=chat,
            headers={"Authorization": f"Bearer {KEYS['team-b']}"},
        ) as resp:
            assert resp.status == 403
            message = (await resp.json())["error"]["message"]
    assert message == "key 'team-b' may not use class 'interactive'"
