"""The context wall end to end: the official `mcp` client -> runtime -> dataplane -> a simulated
engine with a small context window (`--context-window`), tool calls to fake-mcp. A run with
many tool rounds finishes instead of failing with context_length_exceeded; its journal holds the
compactions; a restart replays them without asking for the summaries again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client

from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import SIM_MODEL, LocalStack
from luftpause.testkit.waits import READY_SECONDS
from tests.integration.test_runtime import call

pytestmark = pytest.mark.asyncio(loop_scope="module")

WINDOW = 1024
CALLS = 24  # about two windows' worth of lookup rounds
RUN = {"task": "look up every river", "tools": ["lookup"], "maxToolCalls": CALLS, "maxTokens": 64}
WALL = (
    "--context-window",
    f"{SIM_MODEL}={WINDOW}",
    "--keep-rounds",
    "2",
    "--summary-tokens",
    "200",
)


@dataclass
class Walled:
    stack: LocalStack
    workdir: Path
    mcp_port: int

    @asynccontextmanager
    async def runtime(self, name: str, *flags: str) -> AsyncIterator[str]:
        """A runtime on the stack with its state in `name`, started with `flags`; its URL."""
        port = free_port()
        args = [
            "runtime",
            "--port",
            str(port),
            "--dataplane",
            f"http://127.0.0.1:{self.stack.dataplane_port}",
            "--mcp-server",
            f"http://127.0.0.1:{self.mcp_port}/mcp",
            "--state-dir",
            str(self.workdir / name),
            *flags,
        ]
        proc = Proc(args, name=name, log_path=self.workdir / f"{name}.log")
        await proc.start()
        try:
            await proc.wait_http(f"http://127.0.0.1:{port}/health", READY_SECONDS)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            await proc.stop()

    async def engine_log(self) -> list[dict[str, Any]]:
        return list(
            (await get(self.stack.engine_url(0) + "/debug/requests", as_json=True))["requests"]
        )

    async def summaries(self) -> int:
        return sum(1 for r in await self.engine_log() if r.get("summary"))

    async def refused(self) -> float:
        text = await get(self.stack.engine_url(0) + "/metrics", as_json=False)
        [line] = [x for x in text.splitlines() if x.startswith("luftpause_sim_rejected_total")]
        return float(line.split()[-1])

    def journal(self, name: str) -> list[dict[str, Any]]:
        path = self.workdir / name / "runs.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]


async def get(url: str, *, as_json: bool) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        return await resp.json() if as_json else await resp.text()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def walled(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Walled]:
    workdir: Path = tmp_path_factory.mktemp("wall")
    engine = ("--time-scale", "20", "--tool-rounds", "100", "--context-window", str(WINDOW))
    async with AsyncExitStack() as exits:
        stack = await LocalStack(workdir, engine_args=engine, engines=1).start(exits)
        mcp_port = free_port()
        await stack.launcher.spawn(
            "fake-mcp",
            ["fake-mcp", "--port", str(mcp_port), "--lookup-latency", "0"],
            f"http://127.0.0.1:{mcp_port}/health",
        )
        await stack.wait_healthy()
        yield Walled(stack=stack, workdir=workdir, mcp_port=mcp_port)


def compactions(records: list[dict[str, Any]], handle: str) -> list[dict[str, Any]]:
    return [r for r in records if r["run"] == handle and r["type"] == "compacted"]


async def test_a_long_run_on_a_small_window_finishes_with_its_history_summarised(
    walled: Walled,
) -> None:
    summaries, refused = await walled.summaries(), await walled.refused()
    async with walled.runtime("long", *WALL) as url, asyncio.timeout(60), Client(url) as c:
        out = await call(c, "run", {**RUN, "timeout": 50})
        metrics = await get(url.removesuffix("/mcp") + "/metrics", as_json=False)
    assert out["state"] == "finished" and out["toolCalls"] == CALLS, out
    compacted = compactions(walled.journal("long"), out["handle"])
    assert len(compacted) >= 2 and all(r["summary"] for r in compacted)
    assert all(r["window"] == WINDOW and r["usage"]["promptTokens"] > 0 for r in compacted)
    assert [r["rounds"][0] for r in compacted[1:]] == [r["rounds"][1] + 1 for r in compacted[:-1]]
    # One summary call per compaction, through the dataplane; the engine never refused a turn.
    assert await walled.summaries() - summaries == len(compacted)
    assert await walled.refused() == refused
    counted = f'luftpause_runtime_compactions_total{{outcome="summarised"}} {len(compacted)}.0'
    assert counted in metrics


async def test_a_restart_replays_the_compaction_and_does_not_summarise_again(
    walled: Walled,
) -> None:
    async with walled.runtime("first", *WALL) as url, asyncio.timeout(60), Client(url) as c:
        handle = (await call(c, "run", {**RUN, "timeout": 50}))["handle"]
    # The journal as a crash just after the first compaction would have left it.
    lines = (walled.workdir / "first" / "runs.jsonl").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"type":"compacted"' in line)
    (walled.workdir / "again").mkdir()
    (walled.workdir / "again" / "runs.jsonl").write_text("".join(lines[: cut + 1]))
    summaries = await walled.summaries()
    async with walled.runtime("again", *WALL) as url, asyncio.timeout(60), Client(url) as c:
        [out] = (await call(c, "await", {"handles": [handle], "timeout": 50}))["runs"]
    assert out["state"] == "finished" and out["toolCalls"] == CALLS, out
    replayed, *later = compactions(walled.journal("again"), handle)
    assert later and later[0]["rounds"][0] == replayed["rounds"][1] + 1
    assert await walled.summaries() - summaries == len(later)


async def test_without_the_window_configured_the_engines_refusal_teaches_the_runtime(
    walled: Walled,
) -> None:
    refused = await walled.refused()
    async with walled.runtime("learned") as url, asyncio.timeout(60), Client(url) as c:
        first = await call(c, "run", {**RUN, "timeout": 50})
        second = await call(c, "run", {**RUN, "timeout": 50})
    assert first["state"] == second["state"] == "finished", (first, second)
    assert first["toolCalls"] == second["toolCalls"] == CALLS
    assert await walled.refused() - refused == 1  # once; the window is known from then on
    records = walled.journal("learned")
    assert compactions(records, first["handle"]) and compactions(records, second["handle"])
