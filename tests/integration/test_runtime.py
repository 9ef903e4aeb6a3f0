"""The MCP runtime end to end: the official `mcp` client -> runtime -> dataplane -> engines,
tool calls to fake-mcp; and the crash test (kill -9 at random moments, resume from the journal).

Every process is real and talks over loopback; the engines are the simulator.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client

from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import LocalStack
from luftpause.testkit.waits import READY_SECONDS, eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOOL_ROUNDS = 3  # the simulated model calls a tool this many times, then answers
ENGINE_ARGS = ("--time-scale", "20", "--tool-rounds", str(TOOL_ROUNDS))
SLOW_TOOL_SECONDS = 3.0  # deep_search: long enough to cancel or time out an await during it


@dataclass
class RuntimeStack:
    stack: LocalStack
    workdir: Path
    mcp_port: int
    runtime: Proc | None = None
    runtime_port: int = 0

    @property
    def mcp_url(self) -> str:
        return f"http://127.0.0.1:{self.runtime_port}/mcp"

    def runtime_args(self, port: int, state_dir: Path) -> list[str]:
        return [
            "runtime",
            "--port",
            str(port),
            "--dataplane",
            f"http://127.0.0.1:{self.stack.dataplane_port}",
            "--mcp-server",
            f"http://127.0.0.1:{self.mcp_port}/mcp",
            "--state-dir",
            str(state_dir),
        ]

    async def start_runtime(self, port: int, state_dir: Path, name: str) -> Proc:
        proc = Proc(
            self.runtime_args(port, state_dir), name=name, log_path=self.workdir / f"{name}.log"
        )
        await proc.start()
        await proc.wait_http(f"http://127.0.0.1:{port}/health", READY_SECONDS)
        return proc

    async def tool_calls(self) -> Counter[str]:
        url = f"http://127.0.0.1:{self.mcp_port}/stats"
        async with aiohttp.ClientSession() as s, s.get(url) as resp:
            return Counter((await resp.json())["calls"])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rt(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RuntimeStack]:
    workdir: Path = tmp_path_factory.mktemp("runtime")
    async with AsyncExitStack() as exits:
        stack = await LocalStack(workdir, engine_args=ENGINE_ARGS).start(exits)
        mcp_port = free_port()
        tools = ["--lookup-latency", "0.1", "--deep-search-latency", str(SLOW_TOOL_SECONDS)]
        await stack.launcher.spawn(
            "fake-mcp",
            ["fake-mcp", "--port", str(mcp_port), *tools],
            f"http://127.0.0.1:{mcp_port}/health",
        )
        await stack.wait_healthy()
        rs = RuntimeStack(stack=stack, workdir=workdir, mcp_port=mcp_port)
        rs.runtime_port = free_port()
        rs.runtime = await rs.start_runtime(rs.runtime_port, workdir / "state", "runtime")
        exits.push_async_callback(rs.runtime.stop)
        yield rs


def journal_lines(state_dir: Path) -> list[str]:
    path = state_dir / "runs.jsonl"
    return path.read_text().splitlines() if path.exists() else []


async def journal_grown(state_dir: Path, by: int) -> None:
    """Until the runtime's journal holds `by` records more than now."""
    goal = len(journal_lines(state_dir)) + by

    async def count() -> int:
        return len(journal_lines(state_dir))

    await eventually(count, lambda n: n >= goal, f"{goal} records in {state_dir}/runs.jsonl")


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def test_four_spawned_sub_agents_all_finish_with_their_tool_calls(rt: RuntimeStack) -> None:
    before = await rt.tool_calls()
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        handles = [
            (await call(c, "spawn", {"task": f"river {i}", "tools": ["lookup"]}))["handle"]
            for i in range(4)
        ]
        out = await call(c, "await", {"handles": handles, "timeout": 25})
    runs = out["runs"]
    assert [r["handle"] for r in runs] == handles
    assert all(r["state"] == "finished" and r["result"] for r in runs), runs
    assert all(r["toolCalls"] == TOOL_ROUNDS and r["failedToolCalls"] == 0 for r in runs)
    assert (await rt.tool_calls())["lookup"] - before["lookup"] == 4 * TOOL_ROUNDS


async def test_run_spawns_and_waits_in_one_call(rt: RuntimeStack) -> None:
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        out = await call(c, "run", {"task": "one river", "maxToolCalls": 1, "timeout": 25})
    assert out["state"] == "finished" and out["result"]
    assert out["toolCalls"] == 1 and out["turns"] == 2


async def test_the_last_turn_keeps_the_tools_so_the_engine_serves_its_context_from_cache(
    rt: RuntimeStack,
) -> None:
    # Once the run's one call is spent the tools go on with tool_choice none: the prompt's start
    # (the tools, then the task) is the same as the first turn's, so the engine's prefix cache
    # serves all of it but the call and its result. Dropping the tools re-read everything.
    task = "Look up the longest river of each continent. " * 100
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        spawned = await call(c, "spawn", {"task": task, "tools": ["lookup"], "maxToolCalls": 1})
        [done] = (await call(c, "await", {"handles": [spawned["handle"]], "timeout": 25}))["runs"]
    assert done["state"] == "finished" and done["result"], done
    url = f"http://127.0.0.1:{rt.runtime_port}/status"
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        tree = await resp.json()
    [own] = [n["own"] for n in tree["tree"] if n["handle"] == spawned["handle"]]
    assert own["turns"] == 2 and own["toolCalls"] == 1
    first = len(task) // 4  # the simulator's tokens are 4 characters
    assert own["cachedPromptTokens"] >= 0.95 * first, own


async def test_await_past_its_timeout_returns_the_current_state(rt: RuntimeStack) -> None:
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        spawned = await call(c, "spawn", {"task": "slow", "tools": ["deep_search"]})
        out = await call(c, "await", {"handles": [spawned["handle"], "run-nope"], "timeout": 0.3})
        await call(c, "cancel", {"handle": spawned["handle"]})
    slow, unknown = out["runs"]
    assert slow["state"] in ("running", "tools") and slow["result"] is None
    assert unknown["state"] == "unknown"


async def test_cancel_ends_a_run_and_its_running_descendants(rt: RuntimeStack) -> None:
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        parent = (await call(c, "spawn", {"task": "parent", "tools": ["deep_search"]}))["handle"]
        child_args = {"task": "child", "tools": ["deep_search"], "parent": parent}
        child = (await call(c, "spawn", child_args))["handle"]
        cancelled = await call(c, "cancel", {"handle": parent})
        out = await call(c, "await", {"handles": [parent, child], "timeout": 5})
        status = await call(c, "status", {"handles": [parent]})
    assert sorted(cancelled["cancelled"]) == sorted([parent, child])
    assert [r["state"] for r in out["runs"]] == ["cancelled", "cancelled"]
    assert status["runs"][0]["children"] == [child]


async def test_status_shows_the_run_tree_with_subtree_totals(rt: RuntimeStack) -> None:
    async with asyncio.timeout(30), Client(rt.mcp_url) as c:
        parent = (await call(c, "run", {"task": "p", "maxToolCalls": 1}))["handle"]
        await call(c, "run", {"task": "c", "maxToolCalls": 2, "parent": parent})
        tools = await call(c, "tools", {})
    url = f"http://127.0.0.1:{rt.runtime_port}/status"
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        tree = await resp.json()
    [node] = [n for n in tree["tree"] if n["handle"] == parent]
    assert node["own"]["toolCalls"] == 1 and node["subtree"]["toolCalls"] == 3
    assert node["subtree"]["turns"] == 2 + 3 and node["subtree"]["promptTokens"] > 0
    assert len(node["children"]) == 1
    assert {t["name"] for t in tools["tools"]} >= {"lookup", "deep_search", "delete_record"}


async def test_runs_survive_kill_9_at_random_moments_and_finish_exactly_once(
    rt: RuntimeStack,
) -> None:
    """20 runs; the runtime is killed 3 times mid-flight and restarted with the same command.

    Every run finishes exactly once; no journaled tool round is repeated; await after the last
    restart answers all 20; fake-mcp saw every journaled call (and at most one lost in-flight
    call per run per crash on top).
    """
    state_dir = rt.workdir / "crash-state"
    port = free_port()
    rng = random.Random(7)
    before = (await rt.tool_calls())["lookup"]
    proc = await rt.start_runtime(port, state_dir, "runtime-crash")
    try:
        async with asyncio.timeout(90):
            async with Client(f"http://127.0.0.1:{port}/mcp") as c:
                handles = [
                    (await call(c, "spawn", {"task": f"crash {i}", "tools": ["lookup"]}))["handle"]
                    for i in range(20)
                ]
            for _ in range(3):
                # A random moment mid-flight, counted in journal records rather than seconds.
                await journal_grown(state_dir, by=rng.randint(3, 20))
                await proc.kill()
                proc = await rt.start_runtime(port, state_dir, "runtime-crash")
            async with Client(f"http://127.0.0.1:{port}/mcp") as c:
                out = await call(c, "await", {"handles": handles, "timeout": 40})
    finally:
        await proc.stop()
    runs = out["runs"]
    assert all(r["state"] == "finished" for r in runs), runs
    assert all(r["toolCalls"] == TOOL_ROUNDS for r in runs)
    lines = (rt.workdir / "runtime-crash.log").read_text().splitlines()
    log = [json.loads(line) for line in lines if line.startswith("{")]
    resumed = [e["resumed"] for e in log if e.get("event") == "runtime.replayed"]
    assert len(resumed) == 4 and max(resumed) > 0  # the kills did land mid-flight

    records = [json.loads(line) for line in journal_lines(state_dir)]
    finished = Counter(r["run"] for r in records if r["type"] == "finished")
    assert finished == Counter({h: 1 for h in handles})
    rounds = [(r["run"], r["round"]) for r in records if r["type"] == "round"]
    assert len(rounds) == len(set(rounds)) == 20 * TOOL_ROUNDS
    calls = (await rt.tool_calls())["lookup"] - before
    assert 20 * TOOL_ROUNDS <= calls <= 20 * TOOL_ROUNDS + 3 * 20
