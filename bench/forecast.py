"""Forecast against the run it predicted: each run is forecast at its first completed tool round
(`status`'s `forecast` of a live run), then runs to its end on the engine simulator, and the
forecast's tokens and seconds for the rest of the run are set against what the rest took.

Run: `.venv/bin/python -m bench.forecast [--runs 5]` (about a minute). Real processes on
loopback: two simulated engines (`fake-engine --time-scale 20`), a scheduler, a dataplane,
fake-mcp and the runtime (`--prices`, `--scheduler-url`), driven with the official `mcp` client.
Each scenario gets its own stack, so its first run is forecast cold (the runtime has seen no
turn of the model: the rest of the run comes from the run's own first round alone) and the later
ones warm (blended with what the runtime learned from the runs before). Writes
bench/results/forecast.json: per run the forecast (with its one-sigma range), the actual, and
the relative error; per scenario the mean absolute error, cold and warm apart.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp import Client

from bench.common import write_result
from luftpause.testkit.procs import free_port
from luftpause.testkit.stack import LocalStack

MODEL = "luftpause-sim"
PRICES = f"prices:\n  {MODEL}: {{input: 0.15, cached_input: 0.075, output: 0.60}}\n"
POLL_S = 0.02
RUN_TIMEOUT_S = 120.0
SEED = 21


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A workload: the simulator's tool rounds and answer length, the tool's latency (None:
    fake-mcp's default, uniform 0.5-1.5 s), and the task's length in words (a range: drawn per
    run from a seeded generator)."""

    name: str
    tool_rounds: int
    reply_tokens: int
    tool_seconds: float | None
    task_words: tuple[int, int] = (40, 40)


SCENARIOS = (
    Scenario(name="4 rounds, short answer", tool_rounds=4, reply_tokens=48, tool_seconds=0.5),
    Scenario(name="8 rounds, long answer", tool_rounds=8, reply_tokens=200, tool_seconds=0.3),
    Scenario(
        name="3 rounds, long task",
        tool_rounds=3,
        reply_tokens=96,
        tool_seconds=0.8,
        task_words=(600, 600),
    ),
    Scenario(
        name="5 rounds, tasks and tool times vary",
        tool_rounds=5,
        reply_tokens=120,
        tool_seconds=None,
        task_words=(20, 800),
    ),
)


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    if result.is_error or result.structured_content is None:
        raise RuntimeError(f"{tool} failed: {result.content}")
    return result.structured_content


async def forecast_against_actual(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Spawn a run, take its forecast at its first completed round, let it finish; both."""
    handle = (await call(client, "spawn", args))["handle"]
    async with asyncio.timeout(RUN_TIMEOUT_S):
        while True:
            [run] = (await call(client, "status", {"handles": [handle]}))["runs"]
            if run["toolCalls"] >= 1 or run["state"] in ("finished", "failed", "cancelled"):
                break
            await asyncio.sleep(POLL_S)
        forecast = run.get("forecast")
        if forecast is None:
            raise RuntimeError(f"no forecast for {handle}: {run}")
        [done] = (await call(client, "await", {"handles": [handle], "timeout": 600}))["runs"]
    if done["state"] != "finished":
        raise RuntimeError(f"run {handle} ended {done['state']}: {done.get('error')}")
    now, final = forecast["now"], done["spend"]
    actual = {
        "tokens": final["tokens"] - now["tokens"],
        "seconds": round(final["seconds"] - now["seconds"], 3),
        "usd": final["usd"] - now["usd"],
        "turns": done["turns"] - now["turns"],
    }
    predicted = {
        "tokens": forecast["tokens"]["total"],
        "tokensRange": [forecast["tokens"]["low"], forecast["tokens"]["high"]],
        "seconds": forecast["seconds"]["total"],
        "secondsRange": [forecast["seconds"]["low"], forecast["seconds"]["high"]],
        "usd": forecast["usd"]["expected"],
        "turns": forecast["horizon"]["steps"],
    }
    return {
        "handle": handle,
        "at": {"toolCalls": now["toolCalls"], "turns": now["turns"]},
        "forecast": predicted,
        "actual": actual,
        "error": {k: _error(predicted[k], actual[k]) for k in ("tokens", "seconds", "usd")},
        "sources": forecast["sources"],
        "notes": forecast["notes"],
    }


def _error(predicted: float, actual: float) -> float | None:
    """(forecast - actual) / actual: positive when the forecast was too high."""
    return None if not actual else round((predicted - actual) / actual, 4)


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """Engines, scheduler, dataplane and fake-mcp of a scenario; runtimes start in front."""

    local: LocalStack
    workdir: Path
    mcp_port: int


async def start_stack(exits: AsyncExitStack, workdir: Path, s: Scenario) -> Stack:
    """The simulated engines (`--time-scale 20`), scheduler, dataplane and fake-mcp of `s`."""
    engine_args: tuple[str, ...] = ("--time-scale", "20", "--tool-rounds", str(s.tool_rounds))
    engine_args += ("--reply-tokens", str(s.reply_tokens))
    local = await LocalStack(workdir, engine_args=engine_args).start(exits)
    await local.wait_healthy()
    mcp_port = free_port()
    latency = [] if s.tool_seconds is None else ["--lookup-latency", str(s.tool_seconds)]
    await local.launcher.spawn(
        "fake-mcp",
        ["fake-mcp", "--port", str(mcp_port), *latency],
        f"http://127.0.0.1:{mcp_port}/health",
    )
    (workdir / "prices.yaml").write_text(PRICES)
    return Stack(local=local, workdir=workdir, mcp_port=mcp_port)


async def start_runtime(stack: Stack, name: str = "runtime") -> str:
    """A runtime (`--prices`, `--scheduler-url`) journaling in `<workdir>/<name>-state`; its
    MCP URL."""
    port, local = free_port(), stack.local
    args = ["runtime", "--port", str(port), "--state-dir", str(stack.workdir / f"{name}-state")]
    args += ["--dataplane", f"http://127.0.0.1:{local.dataplane_port}"]
    args += ["--mcp-server", f"http://127.0.0.1:{stack.mcp_port}/mcp"]
    args += ["--prices", str(stack.workdir / "prices.yaml")]
    args += ["--scheduler-url", f"http://127.0.0.1:{local.http_port}"]
    await local.launcher.spawn(name, args, f"http://127.0.0.1:{port}/health")
    return f"http://127.0.0.1:{port}/mcp"


def run_args(s: Scenario, i: int, rng: random.Random) -> dict[str, Any]:
    words = rng.randint(*s.task_words)
    task = f"Find the length of river {i}. " + " ".join(["context"] * words)
    return {"task": task, "tools": ["lookup"], "maxToolCalls": s.tool_rounds}


async def scenario(s: Scenario, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-forecast-") as tmp:
        async with AsyncExitStack() as exits:
            url = await start_runtime(await start_stack(exits, Path(tmp), s))
            rng = random.Random(SEED)
            async with Client(url) as client:
                rows = [
                    await forecast_against_actual(client, run_args(s, i, rng)) for i in range(runs)
                ]
    for i, row in enumerate(rows):
        row["cold"] = i == 0
    return {
        "scenario": s.name,
        "toolRounds": s.tool_rounds,
        "replyTokens": s.reply_tokens,
        "toolSeconds": s.tool_seconds if s.tool_seconds is not None else "uniform 0.5-1.5",
        "taskWords": list(s.task_words),
        "runs": rows,
        "meanAbsError": {
            "cold": _mean_abs(rows[:1]),
            "warm": _mean_abs(rows[1:]),
        },
    }


def _mean_abs(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k in ("tokens", "seconds", "usd"):
        errors = [abs(e) for r in rows if (e := r["error"][k]) is not None]
        out[k] = round(statistics.fmean(errors), 4) if errors else None
    return out


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | run | tokens forecast | actual | error | seconds forecast | actual | error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for sc in results:
        for i, r in enumerate(sc["runs"]):
            f, a, e = r["forecast"], r["actual"], r["error"]
            kind = "cold" if r["cold"] else f"warm {i}"
            lines.append(
                f"| {sc['scenario']} | {kind} | {f['tokens']} | {a['tokens']} | "
                f"{e['tokens']:+.1%} | {f['seconds']:.2f} | {a['seconds']:.2f} | "
                f"{e['seconds']:+.1%} |"
            )
    return "\n".join(lines)


async def bench(runs: int) -> dict[str, Any]:
    started = time.perf_counter()
    results = [await scenario(s, runs) for s in SCENARIOS]
    return {
        "runsPerScenario": runs,
        "timeScale": 20,
        "scenarios": results,
        "wallSeconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs per scenario (the first is cold)")
    ns = p.parse_args()
    result = asyncio.run(bench(ns.runs))
    path = write_result("forecast", result)
    print(table(result["scenarios"]))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
