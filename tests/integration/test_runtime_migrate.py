"""Fork, export and import on real processes: the official `mcp` client -> runtime ->
dataplane -> simulated engines, tool calls to fake-mcp; a second runtime process (its own
state dir) takes the bundles; and SIGKILL during a fork and during an import, after which
every run still finishes exactly once.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client

from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import LocalStack
from luftpause.testkit.waits import eventually
from tests.integration.test_runtime import ENGINE_ARGS, TOOL_ROUNDS, RuntimeStack, call

pytestmark = pytest.mark.asyncio(loop_scope="module")

FORKS = 4


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rt(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RuntimeStack]:
    workdir: Path = tmp_path_factory.mktemp("runtime-migrate")
    async with AsyncExitStack() as exits:
        stack = await LocalStack(workdir, engine_args=ENGINE_ARGS).start(exits)
        mcp_port = free_port()
        await stack.launcher.spawn(
            "fake-mcp",
            ["fake-mcp", "--port", str(mcp_port), "--lookup-latency", "0.2"],
            f"http://127.0.0.1:{mcp_port}/health",
        )
        await stack.wait_healthy()
        yield RuntimeStack(stack=stack, workdir=workdir, mcp_port=mcp_port)


class Runtime:
    """One runtime process on its own port and state dir, restartable after a SIGKILL."""

    def __init__(self, rt: RuntimeStack, name: str) -> None:
        self.rt, self.name = rt, name
        self.port = free_port()
        self.state_dir = rt.workdir / f"{name}-state"
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Runtime:
        self.proc = await self.rt.start_runtime(self.port, self.state_dir, self.name)
        return self

    async def kill(self) -> None:
        assert self.proc is not None
        await self.proc.kill()  # SIGKILL of the process this test started, by its PID

    async def stop(self) -> None:
        if self.proc is not None:
            await self.proc.stop()

    def records(self) -> list[dict[str, Any]]:
        path = self.state_dir / "runs.jsonl"
        lines = path.read_bytes().split(b"\n")[:-1] if path.exists() else []
        flat: list[dict[str, Any]] = []
        for line in lines:
            record = json.loads(line)
            flat += record["records"] if record["type"] == "batch" else [record]
        return flat

    def batches(self) -> int:
        """Batches that begin runs (a fork's, an import's), not a turn with its first send."""
        path = self.state_dir / "runs.jsonl"
        data = path.read_bytes() if path.exists() else b""
        return data.count(b'"type":"batch"') - data.count(b'"records":[{"v":2,"type":"turn"')

    async def tool(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        async with asyncio.timeout(30), Client(f"{self.url}/mcp") as c:
            return await call(c, tool, args)

    async def refused(self, tool: str, args: dict[str, Any]) -> str:
        async with asyncio.timeout(30), Client(f"{self.url}/mcp") as c:
            result = await c.call_tool(tool, args)
        assert result.is_error, result
        return "\n".join(getattr(x, "text", "") for x in result.content)

    async def http(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.request(method, self.url + path, data=body) as r:
            return r.status, await r.read()


async def started(rt: RuntimeStack, name: str, exits: AsyncExitStack) -> Runtime:
    runtime = await Runtime(rt, name).start()
    exits.push_async_callback(runtime.stop)
    return runtime


async def until(probe: Callable[[], bool], what: str, every: float = 0.01) -> None:
    async def read() -> bool:
        return probe()

    await eventually(read, bool, what, every=every)


def exactly_once(records: list[dict[str, Any]], handles: list[str]) -> None:
    """One `finished` record per run, and no round journaled twice."""
    finished = Counter(r["run"] for r in records if r["type"] == "finished")
    assert finished == Counter(dict.fromkeys(handles, 1)), finished
    rounds = [(r["run"], r["round"]) for r in records if r["type"] == "round"]
    assert len(rounds) == len(set(rounds)), rounds


def journaled_calls(records: list[dict[str, Any]]) -> int:
    return sum(len(r["results"]) for r in records if r["type"] == "round")


# --- fork ---


async def test_a_forked_run_goes_on_n_ways_and_every_run_finishes_with_its_own_calls(
    rt: RuntimeStack,
) -> None:
    async with AsyncExitStack() as exits:
        a = await started(rt, "fork", exits)
        before = (await rt.tool_calls())["lookup"]
        source = (await a.tool("spawn", {"task": "rivers", "tools": ["lookup"]}))["handle"]
        await until(lambda: any(r["type"] == "round" for r in a.records()), "a first round")
        forked = await a.tool("fork", {"handle": source, "n": FORKS, "instructions": "go on"})
        handles = [source, *forked["handles"]]
        out = await a.tool("await", {"handles": handles, "timeout": 25})
        records = a.records()
    assert all(r["state"] == "finished" and r["toolCalls"] == TOOL_ROUNDS for r in out["runs"])
    exactly_once(records, handles)
    # Every call went to fake-mcp once: the source's rounds, then each fork's own.
    assert (await rt.tool_calls())["lookup"] - before == journaled_calls(records)
    assert journaled_calls(records) == TOOL_ROUNDS + FORKS * (TOOL_ROUNDS - forked["round"])


async def test_bad_arguments_to_fork_and_export_are_clear_tool_errors(rt: RuntimeStack) -> None:
    async with AsyncExitStack() as exits:
        a = await started(rt, "bad-args", exits)
        done = await a.tool("run", {"task": "t", "tools": ["lookup"], "timeout": 25})
        handle = done["handle"]
        assert "no run run-x" in await a.refused("fork", {"handle": "run-x"})
        assert "less than or equal to 16" in await a.refused("fork", {"handle": handle, "n": 99})
        assert "greater than or equal to 1" in await a.refused("fork", {"handle": handle, "n": 0})
        args = {"handle": handle, "n": 3, "instructions": ["a", "b"]}
        assert "2 given for 3" in await a.refused("fork", args)
        assert "no run run-x" in await a.refused("export", {"handle": "run-x"})
        assert "valid string" in await a.refused("import", {"bundle": ["not", "text"]})
        assert a.batches() == 0


# --- export and import ---


async def test_a_run_exported_mid_flight_finishes_on_another_runtime(rt: RuntimeStack) -> None:
    async with AsyncExitStack() as exits:
        a, b = await started(rt, "export-a", exits), await started(rt, "import-b", exits)
        handle = (await a.tool("spawn", {"task": "move me", "tools": ["lookup"]}))["handle"]
        await until(lambda: any(r["type"] == "round" for r in a.records()), "a first round")
        status, body = await a.http("GET", f"/runs/{handle}/export")
        assert status == 200
        await a.tool("cancel", {"handle": handle})  # moved, not copied
        [entry] = json.loads(body)["runs"]
        out = await b.tool("import", {"bundle": body.decode()})
        assert out["imported"] == [handle]
        [done] = (await b.tool("await", {"handles": [handle], "timeout": 25}))["runs"]
    assert done["state"] == "finished" and done["toolCalls"] == TOOL_ROUNDS
    records = b.records()
    exactly_once(records, [handle])
    rounds = sorted(r["round"] for r in records if r["type"] == "round")
    assert rounds == list(range(1, TOOL_ROUNDS + 1)) and entry["round"] >= 1
    moved = [r for r in records if r["type"] == "round" and r["round"] <= entry["round"]]
    assert moved == [r for r in a.records() if r["type"] == "round"][: entry["round"]]


async def test_every_bad_bundle_is_refused_by_the_process_with_nothing_journaled(
    rt: RuntimeStack,
) -> None:
    async with AsyncExitStack() as exits:
        a, b = await started(rt, "bundle-a", exits), await started(rt, "bundle-b", exits)
        handle = (await a.tool("run", {"task": "t", "tools": ["lookup"], "timeout": 25}))["handle"]
        good = (await a.tool("export", {"handle": handle}))["bundle"]
        doc = json.loads(good)
        forged = json.loads(good)
        forged["records"][-1]["result"] = "forged"
        bad = {
            "malformed": "{not json",
            "format": json.dumps({**doc, "format": "zip"}),
            "newer": json.dumps({**doc, "version": 2}),
            "corrupt": json.dumps(forged),
        }
        for name, text in bad.items():
            status, body = await b.http("POST", "/runs/import", text.encode())
            assert status == 400, (name, body)
            assert await b.refused("import", {"bundle": text})
        assert b.records() == [] and (await b.tool("status", {}))["runs"] == []
        # Into the runtime it came from: its run exists there already.
        status, body = await a.http("POST", "/runs/import", good.encode())
        assert status == 409 and b"already exist" in body
        assert "already exist" in await a.refused("import", {"bundle": good})
        assert a.batches() == 0


# --- SIGKILL ---


async def kill_during(
    runtime: Runtime, action: Awaitable[Any], delay: float | None, batches_before: int
) -> None:
    """Start `action` (a fork or an import), then SIGKILL the runtime once its batch is on disk
    (`delay` None) or after `delay` seconds, whichever the test asks for; restart it."""
    task = asyncio.ensure_future(action)
    if delay is None:
        await until(lambda: runtime.batches() > batches_before, "the batch on disk", every=0.002)
    else:
        await asyncio.sleep(delay)  # a random moment: the kill may land before, in or after it
    await runtime.kill()
    await asyncio.gather(task, return_exceptions=True)  # its connection died with the process
    await runtime.start()


@pytest.mark.parametrize("moment", ["batch-on-disk", "random"])
async def test_a_sigkill_during_a_fork_leaves_all_forks_or_none_each_finishing_once(
    rt: RuntimeStack, moment: str
) -> None:
    async with AsyncExitStack() as exits:
        a = await started(rt, f"kill-fork-{moment}", exits)
        before = (await rt.tool_calls())["lookup"]
        sources = [
            (await a.tool("spawn", {"task": f"source {i}", "tools": ["lookup"]}))["handle"]
            for i in range(2)
        ]
        await until(lambda: any(r["type"] == "round" for r in a.records()), "a first round")
        fork = a.tool("fork", {"handle": sources[0], "n": FORKS})
        delay = None if moment == "batch-on-disk" else random.Random(5).uniform(0.0, 0.05)
        await kill_during(a, fork, delay, a.batches())
        forks = [r["run"] for r in a.records() if r["type"] == "forked"]
        assert len(forks) in (0, FORKS) and (moment == "random" or len(forks) == FORKS)
        out = await a.tool("await", {"handles": sources + forks, "timeout": 40})
        records = a.records()
    assert all(r["state"] == "finished" and r["toolCalls"] == TOOL_ROUNDS for r in out["runs"])
    exactly_once(records, sources + forks)
    calls = (await rt.tool_calls())["lookup"] - before
    # Every journaled call was made; a call in flight at the kill may run again (one a run).
    assert journaled_calls(records) <= calls <= journaled_calls(records) + len(sources + forks)


@pytest.mark.parametrize("moment", ["batch-on-disk", "random"])
async def test_a_sigkill_during_an_import_leaves_the_run_whole_or_absent_and_it_finishes_once(
    rt: RuntimeStack, moment: str
) -> None:
    async with AsyncExitStack() as exits:
        a = await started(rt, f"kill-import-a-{moment}", exits)
        b = await started(rt, f"kill-import-b-{moment}", exits)
        handle = (await a.tool("spawn", {"task": "move", "tools": ["lookup"]}))["handle"]
        await until(lambda: any(r["type"] == "round" for r in a.records()), "a first round")
        bundle = (await a.tool("export", {"handle": handle}))["bundle"]
        await a.tool("cancel", {"handle": handle})
        delay = None if moment == "batch-on-disk" else random.Random(6).uniform(0.0, 0.05)
        await kill_during(b, b.http("POST", "/runs/import", bundle.encode()), delay, 0)
        if not b.records():  # killed before the import was journaled: nothing of it is there
            assert moment == "random" and b.batches() == 0
            status, _ = await b.http("POST", "/runs/import", bundle.encode())
            assert status == 200
        else:  # journaled whole before the kill: a second import is refused, not doubled
            status, _ = await b.http("POST", "/runs/import", bundle.encode())
            assert status == 409
        [done] = (await b.tool("await", {"handles": [handle], "timeout": 40}))["runs"]
    assert done["state"] == "finished" and done["toolCalls"] == TOOL_ROUNDS
    assert b.batches() == 1
    exactly_once(b.records(), [handle])
