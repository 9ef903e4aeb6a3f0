"""The fault table: a sub-agent's one tool call through every failure between the runtime and a
tool server, on real processes (scheduler, dataplane, engine simulator, `luftpause runtime`,
`luftpause fake-mcp` with a ledger that counts requests and executions per idempotency key).

Each row runs once with `charge` (neither idempotent nor read-only: each execution charges
again) and once with `set_status` (idempotentHint). The run is spawned with `maxToolCalls: 1`,
so it makes one call, then answers. Expected everywhere: `charge` executed exactly once, or the
model told its outcome is unknown, and never sent twice; every run finishes exactly once.

    row                                 charge                       set_status
    runtime SIGKILL before the send     sent once, answered          sent once, answered
    runtime SIGKILL after the send      sent once, told unknown      sent again, answered
    runtime SIGKILL after the result,   sent once, told unknown      sent again, answered from
      before it is journaled                                           the server's stored result
    runtime SIGKILL after the journal   sent once, answered          sent once, answered
    tool server SIGKILL mid-call        sent once, told unknown      sent again, executed again
    tool server stops answering         sent once, told unknown      sent once, told unknown
                                                                       (its time is spent)
    session broken before the send      sent once, answered          sent once, answered

The moments a SIGKILL from outside cannot aim at (before the send is journaled, after the result
arrived and before it is journaled) are the runtime's failpoints (`LUFTPAUSE_FAILPOINT`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from mcp import Client

from luftpause.runtime.core import forks
from luftpause.runtime.loop.failpoints import AFTER_RESULT, BEFORE_SEND, ENV
from luftpause.testkit.fakemcp.dedup import read_ledger
from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import Launcher, LocalStack
from luftpause.testkit.waits import READY_SECONDS, WAIT_SECONDS, eventually, local_url

pytestmark = pytest.mark.asyncio(loop_scope="module")

ENGINE_ARGS = ("--time-scale", "50")
TOOL_SECONDS = 0.8  # charge and set_status: long enough to act in the middle of a call
TOOLS = ("charge", "set_status")
UNKNOWN = "may or may not have run"


@dataclass
class ToolServer:
    """A fake-mcp child whose ledger outlives it; started again on the same port."""

    launcher: Launcher
    name: str
    port: int
    ledger: Path
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return local_url(self.port) + "/mcp"

    async def start(self) -> ToolServer:
        args = ["fake-mcp", "--port", str(self.port), "--ledger", str(self.ledger)]
        args += ["--write-latency", str(TOOL_SECONDS)]
        self.proc = await self.launcher.spawn(self.name, args, local_url(self.port) + "/health")
        return self

    async def kill(self) -> None:
        assert self.proc is not None
        await self.proc.kill()

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None and self.proc.proc is not None
        self.proc.proc.send_signal(sig)

    def keys(self, handle: str) -> dict[str, dict[str, Any]]:
        """The ledger's counts of the run's calls (read from the file: the server may be dead
        or stopped)."""
        counts = read_ledger(self.ledger).snapshot()
        return {k: v for k, v in counts.items() if k.startswith(f"{handle}/")}


@dataclass
class Runtime:
    """A `luftpause runtime` child; `state` outlives it."""

    launcher: Launcher
    name: str
    port: int
    state: Path
    tools: ToolServer
    args: tuple[str, ...] = ()
    proc: Proc | None = None

    @property
    def mcp_url(self) -> str:
        return local_url(self.port) + "/mcp"

    async def start(self, dataplane: str, failpoint: str | None = None) -> Runtime:
        args = ["runtime", "--port", str(self.port), "--state-dir", str(self.state)]
        args += ["--dataplane", dataplane, "--mcp-server", self.tools.url, *self.args]
        env = {ENV: failpoint} if failpoint else None
        name = f"{self.name}-{next(_starts)}"
        self.proc = await self.launcher.spawn(name, args, local_url(self.port) + "/health", env)
        return self

    async def kill(self) -> None:
        assert self.proc is not None
        await self.proc.kill()

    async def died(self) -> int | None:
        """The child's exit code, once it exited on its own (a failpoint)."""
        assert self.proc is not None and self.proc.proc is not None
        async with asyncio.timeout(WAIT_SECONDS):
            return await self.proc.proc.wait()

    def records(self, handle: str) -> list[dict[str, Any]]:
        path = self.state / "runs.jsonl"
        lines = path.read_bytes().split(b"\n") if path.exists() else []
        whole = (json.loads(line) for line in lines if line.strip())
        return [r for r in forks.expand(whole) if r.get("run") == handle]


_starts = itertools.count(1)


@dataclass
class Faults:
    stack: LocalStack
    launcher: Launcher
    workdir: Path
    rows: itertools.count[int]
    shared: ToolServer | None = None

    @property
    def dataplane(self) -> str:
        return local_url(self.stack.dataplane_port)

    async def pair(self, *runtime_args: str, own: bool = False) -> tuple[ToolServer, Runtime]:
        """A tool server (the rows' shared one, or with `own` its own, to kill or stop) and a
        runtime of its own, not started yet. Keys are per run, so rows can share a server."""
        n = next(self.rows)
        tools = self.shared
        if own or tools is None:
            ledger = self.workdir / f"{n}.ledger"
            tools = await ToolServer(self.launcher, f"tools-{n}", free_port(), ledger).start()
            if not own:
                self.shared = tools
        state = self.workdir / f"state-{n}"
        runtime = Runtime(self.launcher, f"runtime-{n}", free_port(), state, tools, runtime_args)
        return tools, runtime


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def faults(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Faults]:
    workdir: Path = tmp_path_factory.mktemp("faults")
    async with AsyncExitStack() as exits:
        stack = await LocalStack(workdir, engine_args=ENGINE_ARGS, engines=1).start(exits)
        await stack.wait_healthy()
        yield Faults(stack, Launcher(workdir, exits), workdir, itertools.count(1))


async def spawn(runtime: Runtime, tool: str) -> str:
    async with asyncio.timeout(WAIT_SECONDS), Client(runtime.mcp_url) as c:
        args = {"task": f"use {tool} once", "tools": [tool], "maxToolCalls": 1}
        result = await c.call_tool("spawn", args)
    assert not result.is_error and result.structured_content is not None, result.content
    return str(result.structured_content["handle"])


async def finished(runtime: Runtime, handle: str) -> dict[str, Any]:
    """The run once over (its summary), after checking it ended exactly once."""
    async with asyncio.timeout(WAIT_SECONDS + 5), Client(runtime.mcp_url) as c:
        result = await c.call_tool("await", {"handles": [handle], "timeout": WAIT_SECONDS})
    assert result.structured_content is not None
    [summary] = result.structured_content["runs"]
    assert summary["state"] == "finished", summary
    ends = [r for r in runtime.records(handle) if r["type"] == "finished"]
    assert len(ends) == 1, ends
    return dict(summary)


def told(runtime: Runtime, handle: str) -> str:
    """What the model read as the call's result."""
    [round_] = [r for r in runtime.records(handle) if r["type"] == "round"]
    [result] = round_["results"]
    return str(result["content"])


def one_key(tools: ToolServer, handle: str) -> dict[str, Any]:
    [counts] = tools.keys(handle).values()
    return counts


async def in_flight(tools: ToolServer, handle: str) -> None:
    """Until the run's call is executing at the tool server (begun, not finished)."""

    async def probe() -> dict[str, dict[str, Any]]:
        return tools.keys(handle)

    def executing(keys: dict[str, dict[str, Any]]) -> bool:
        return any(k["executions"] and not k["answered"] for k in keys.values())

    await eventually(probe, executing, f"{handle}'s call executing at {tools.name}")


async def journaled(runtime: Runtime, handle: str, kind: str) -> None:
    async def probe() -> list[str]:
        return [r["type"] for r in runtime.records(handle)]

    await eventually(probe, lambda kinds: kind in kinds, f"a {kind} record of {handle}")


def report(row: str, tool: str, counts: dict[str, Any], result: str) -> None:
    outcome = "told unknown" if UNKNOWN in result else "answered"
    print(  # the fault table, as measured: pytest -s shows it
        f"FAULT {row:<28} {tool:<10} received={counts['received']} "
        f"executions={counts['executions']} {outcome}"
    )


# --- the rows --------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", TOOLS)
async def test_runtime_killed_before_the_call_is_sent_sends_it_once_after_the_restart(
    faults: Faults, tool: str
) -> None:
    tools, runtime = await faults.pair()
    await runtime.start(faults.dataplane, failpoint=BEFORE_SEND)
    handle = await spawn(runtime, tool)
    assert await runtime.died() == -signal.SIGKILL
    assert tools.keys(handle) == {}  # nothing left
    await runtime.start(faults.dataplane)
    summary = await finished(runtime, handle)
    counts = one_key(tools, handle)
    report("kill before send", tool, counts, told(runtime, handle))
    assert (counts["received"], counts["executions"]) == (1, 1)
    assert summary["failedToolCalls"] == 0


async def spawn_both(runtime: Runtime) -> dict[str, str]:
    """One run per tool, side by side: tool -> handle."""
    return {tool: await spawn(runtime, tool) for tool in TOOLS}


async def both_in_flight(tools: ToolServer, runs: dict[str, str]) -> None:
    for handle in runs.values():
        await in_flight(tools, handle)


async def test_runtime_killed_after_the_call_is_sent_never_sends_a_charge_twice(
    faults: Faults,
) -> None:
    tools, runtime = await faults.pair()
    await runtime.start(faults.dataplane)
    runs = await spawn_both(runtime)
    await both_in_flight(tools, runs)
    await runtime.kill()
    await runtime.start(faults.dataplane)
    # set_status is sent again with its key. The server cut its first execution when the
    # runtime's connection dropped (the SDK cancels a request whose client left), so the one
    # sent again runs again: harmless, the tool says it is idempotent.
    await charge_unknown_status_twice("kill after send", tools, runtime, runs)


async def charge_unknown_status_twice(
    row: str, tools: ToolServer, runtime: Runtime, runs: dict[str, str]
) -> None:
    """charge sent once and told unknown; set_status sent again and executed again."""
    charge, status = [await finished(runtime, runs[t]) for t in TOOLS]
    charged, result = one_key(tools, runs["charge"]), told(runtime, runs["charge"])
    report(row, "charge", charged, result)
    assert (charged["received"], charged["executions"]) == (1, 1) and UNKNOWN in result
    assert charge["failedToolCalls"] == 1
    set_, result = one_key(tools, runs["set_status"]), told(runtime, runs["set_status"])
    report(row, "set_status", set_, result)
    assert (set_["received"], set_["executions"]) == (2, 2) and status["failedToolCalls"] == 0


@pytest.mark.parametrize("tool", TOOLS)
async def test_runtime_killed_after_the_result_before_it_is_journaled_never_sends_twice(
    faults: Faults, tool: str
) -> None:
    tools, runtime = await faults.pair()
    await runtime.start(faults.dataplane, failpoint=AFTER_RESULT)
    handle = await spawn(runtime, tool)
    assert await runtime.died() == -signal.SIGKILL
    assert one_key(tools, handle)["answered"]  # the server had answered
    await runtime.start(faults.dataplane)
    summary = await finished(runtime, handle)
    counts, result = one_key(tools, handle), told(runtime, handle)
    report("kill after result", tool, counts, result)
    assert counts["executions"] == 1
    if tool == "charge":
        assert counts["received"] == 1 and UNKNOWN in result
    else:  # sent again with its key: answered from the server's stored result
        assert counts["received"] == 2 and summary["failedToolCalls"] == 0
        assert result == "ticket ticket for the next step is now status for the next step"


async def test_runtime_killed_after_the_result_is_journaled_keeps_it(faults: Faults) -> None:
    tools, runtime = await faults.pair()
    await runtime.start(faults.dataplane)
    runs = await spawn_both(runtime)
    for handle in runs.values():
        await journaled(runtime, handle, "round")
    await runtime.kill()
    await runtime.start(faults.dataplane)
    await each_sent_once("kill after journal", tools, runtime, runs)


async def each_sent_once(
    row: str, tools: ToolServer, runtime: Runtime, runs: dict[str, str]
) -> None:
    """Every run's call sent and executed once, and answered."""
    for tool, handle in runs.items():
        summary = await finished(runtime, handle)
        counts = one_key(tools, handle)
        report(row, tool, counts, told(runtime, handle))
        assert (counts["received"], counts["executions"]) == (1, 1)
        assert summary["failedToolCalls"] == 0


async def test_tool_server_killed_mid_call_never_runs_a_charge_twice(faults: Faults) -> None:
    tools, runtime = await faults.pair("--tool-timeout", "30", own=True)
    await runtime.start(faults.dataplane)
    runs = await spawn_both(runtime)
    await both_in_flight(tools, runs)
    await tools.kill()
    await tools.start()
    # set_status's first execution died with the server: the one sent again executes again.
    await charge_unknown_status_twice("tool server killed mid-call", tools, runtime, runs)


async def test_tool_server_that_stops_answering_times_out_once(faults: Faults) -> None:
    tools, runtime = await faults.pair("--tool-timeout", "2", own=True)
    await runtime.start(faults.dataplane)
    runs = await spawn_both(runtime)
    await both_in_flight(tools, runs)
    tools.signal(signal.SIGSTOP)
    try:
        summaries = [await finished(runtime, runs[t]) for t in TOOLS]
    finally:
        tools.signal(signal.SIGCONT)
    for (tool, handle), summary in zip(runs.items(), summaries, strict=True):
        counts, result = one_key(tools, handle), told(runtime, handle)
        report("tool server stops answering", tool, counts, result)
        assert (counts["received"], counts["executions"]) == (1, 1)
        assert UNKNOWN in result and summary["failedToolCalls"] == 1
        [sent] = [r for r in runtime.records(handle) if r["type"] == "call"]  # never again
        assert sent["attempt"] == 1


async def test_a_session_broken_before_the_send_is_reconnected_and_the_call_sent_once(
    faults: Faults,
) -> None:
    tools, runtime = await faults.pair("--tool-timeout", "30", own=True)
    await runtime.start(faults.dataplane)
    await ready_tools(runtime)
    await tools.kill()
    runs = await spawn_both(runtime)
    for handle in runs.values():
        await journaled(runtime, handle, "call")  # it is trying, with nobody there
    await tools.start()
    await each_sent_once("session broken before send", tools, runtime, runs)


async def ready_tools(runtime: Runtime) -> None:
    """Until the runtime has its session with the tool server (its tools are listed)."""

    async def listed() -> list[str]:
        async with Client(runtime.mcp_url) as c:
            result = await c.call_tool("tools", {})
        assert result.structured_content is not None
        return [t["name"] for t in result.structured_content["tools"]]

    await eventually(listed, lambda names: "charge" in names, "the runtime's tools")


# --- every timeout is a total -------------------------------------------------------------------


async def test_a_slow_tools_call_ends_at_its_timeout_told_it_may_have_run(faults: Faults) -> None:
    tools, runtime = await faults.pair("--tool-timeout", "0.4")  # the tool takes 0.8 s
    await runtime.start(faults.dataplane)
    handle = await spawn(runtime, "set_status")
    summary = await finished(runtime, handle)
    [round_] = [r for r in runtime.records(handle) if r["type"] == "round"]
    [result] = round_["results"]
    assert "no answer within its 0.4 s" in result["content"]
    assert result["seconds"] < 0.4 + 0.6  # one wait, not one per try
    assert summary["failedToolCalls"] == 1 and one_key(tools, handle)["received"] == 1


async def test_a_slow_engines_turn_fails_at_the_turn_timeout_retries_included(
    faults: Faults,
) -> None:
    """An engine that takes 64 s a reply, and a 1.5 s turn: the run fails after one try, the
    time of its retries being the same 1.5 s (before, 4 tries of 1.5 s each, and backoff)."""
    engine = free_port()
    slow = ["fake-engine", "--port", str(engine), "--decode-base-ms", "1000"]
    await faults.launcher.spawn("slow-engine", slow, local_url(engine) + "/health")
    _, runtime = await faults.pair("--turn-timeout", "1.5")
    await runtime.start(local_url(engine))
    handle = await spawn(runtime, "charge")
    async with asyncio.timeout(WAIT_SECONDS), Client(runtime.mcp_url) as c:
        result = await c.call_tool("await", {"handles": [handle], "timeout": WAIT_SECONDS})
    assert result.structured_content is not None
    [summary] = result.structured_content["runs"]
    assert summary["state"] == "failed", summary
    assert summary["error"].startswith("the turn did not finish within 1.5 s (1 tries")
    [end] = [r for r in runtime.records(handle) if r["type"] == "finished"]
    [begin] = [r for r in runtime.records(handle) if r["type"] == "spawned"]
    assert end["at"] - begin["spec"]["spawnedAt"] < 1.5 + 1.0
    assert READY_SECONDS > 0
