"""Fan-out through the MCP runtime: 16 sub-agents spawned at once and awaited together, against
the same 16 run one at a time.

Run: `.venv/bin/python -m bench.runtime_fanout [--agents 16] [--tool-seconds 2] [--repeats 1]`.
Real processes on loopback: two simulated engines (each sub-agent calls a tool 3 times, then
answers), a scheduler, a dataplane, fake-mcp with both tools fixed at `--tool-seconds`, and
the runtime, driven with the official `mcp` client. Arm "parallel" spawns every sub-agent and
awaits them all in one call; arm "sequential" calls `run` for each in turn. With `--repeats`
the arms' order rotates from repeat to repeat (`common.rotated`). Writes
bench/results/runtime_fanout.json: per arm the median wall time over repeats, each repeat with
the machine's load while the arm ran (`common.LoadWatch`), and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from mcp import Client

from bench.common import LoadWatch, rotated, write_result
from luftpause.testkit.stack import LocalStack, start_runtime

TOOL_ROUNDS = 3
ARMS = ("parallel", "sequential")


async def _call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    if result.is_error or result.structured_content is None:
        raise RuntimeError(f"{tool} failed: {result.content}")
    return result.structured_content


async def _parallel(url: str, agents: int) -> tuple[float, list[dict[str, Any]]]:
    async with Client(url) as c:
        started = time.perf_counter()
        handles = [
            (await _call(c, "spawn", {"task": f"river {i}", "tools": ["lookup"]}))["handle"]
            for i in range(agents)
        ]
        out = await _call(c, "await", {"handles": handles, "timeout": 600})
        return time.perf_counter() - started, out["runs"]


async def _sequential(url: str, agents: int) -> tuple[float, list[dict[str, Any]]]:
    async with Client(url) as c:
        started = time.perf_counter()
        runs = [
            await _call(c, "run", {"task": f"river {i}", "tools": ["lookup"], "timeout": 600})
            for i in range(agents)
        ]
        return time.perf_counter() - started, runs


async def _start(exits: AsyncExitStack, workdir: Path, tool_seconds: float) -> str:
    engine_args = ("--tool-rounds", str(TOOL_ROUNDS))
    stack = await LocalStack(workdir, engine_args=engine_args).start(exits)
    await stack.wait_healthy()
    dataplane = stack.base_url.removesuffix("/v1")
    return (await start_runtime(exits, workdir, dataplane, tool_seconds=tool_seconds)).mcp_url


def _summary(seconds: float, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 3),
        "finished": sum(1 for r in runs if r["state"] == "finished"),
        "toolCalls": sum(r["toolCalls"] for r in runs),
        "turns": sum(r["turns"] for r in runs),
    }


def _over_repeats(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm: the median wall time over its repeats, min..max, and each repeat."""
    seconds = [r["seconds"] for r in repeats]
    return {
        "seconds": round(statistics.median(seconds), 3),
        "secondsRange": [min(seconds), max(seconds)],
        "finished": min(r["finished"] for r in repeats),  # the fewest in any repeat
        "repeats": repeats,
    }


async def bench(agents: int, tool_seconds: float, repeats: int = 1) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        async with AsyncExitStack() as exits:
            url = await _start(exits, Path(tmp), tool_seconds)
            await _call_warmup(url)
            for r in range(repeats):
                for arm in rotated(ARMS, r):
                    with LoadWatch() as load:
                        took = await (_parallel if arm == "parallel" else _sequential)(url, agents)
                    runs[arm].append({**_summary(*took), "load": load.summary()})
    parallel, sequential = (_over_repeats(runs[arm]) for arm in ARMS)
    return {
        "agents": agents,
        "toolSeconds": tool_seconds,
        "toolCallsPerAgent": TOOL_ROUNDS,
        "parallel": parallel,
        "sequential": sequential,
        "speedup": round(sequential["seconds"] / parallel["seconds"], 2),
    }


async def _call_warmup(url: str) -> None:
    async with Client(url) as c:
        await _call(c, "run", {"task": "warm up", "maxToolCalls": 0, "timeout": 60})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--tool-seconds", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=1, help="of both arms, their order rotated")
    ns = p.parse_args()
    result = asyncio.run(bench(ns.agents, ns.tool_seconds, ns.repeats))
    path = write_result("runtime_fanout", result)
    print(
        f"{ns.agents} sub-agents: spawn+await all {result['parallel']['seconds']} s, "
        f"one at a time {result['sequential']['seconds']} s, {result['speedup']}x -> {path}"
    )


if __name__ == "__main__":
    main()
