"""The runtime's journal, file against PostgreSQL: what a journaled record costs, spawn/await
throughput with one and three replicas, and how long a dead replica's runs wait.

Run: `.venv/bin/python -m bench.runtime_fleet [--repeat 3] [--runs 60]`. Three parts, arms side
by side in one run, their order rotated per repeat (`common.rotated`), each arm's entry with the
machine's load per repeat (`common.LoadWatch`, under "load"):

- records: one run's records appended one after the other, each awaited (the latency a run
  waits per journaled step: the file's write+fsync against PostgreSQL's commit), then
  `WRITERS` runs appending at once (records per second: the file's one lock against
  PostgreSQL's group commit). Arms `file`, `postgresql` (one replica's `Database`) and
  `postgresql-3` (three at once on the same server, as three replicas). In process, on this
  machine's disk and a local PostgreSQL (`testkit.postgres`, fsync on).
- throughput: real processes (engine simulator at time scale 50, one tool round per run,
  dataplane, scheduler, fake-mcp with a 50 ms `set_status`): arms `file-1` (one runtime, its
  file journal), `pg-1` (one runtime on PostgreSQL) and `pg-3` (three, the spawns spread over
  them); `--runs` runs spawned at once, then awaited (280 s at most); runs finished per second
  from the first spawn to the await's return, the runs not over by then (`unfinished`, per
  repeat), and the mean seconds per journaled record under that load, from the runtimes' own
  `luftpause_runtime_journal_append_seconds` histograms.
- fail-over: the three replicas, 30 runs (2 s tool calls, `set_status`: idempotent, so sent
  again after the take-over) spread over them, one replica SIGKILLed while its runs' calls are
  out; for each run it had not finished, the seconds from the kill to the first record a
  survivor wrote for it (taken over) and to its finished record, with `--lease` seconds leases.
  The killed replica comes back under a new name for the next repeat.

Writes bench/results/runtime_fleet.json.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
from mcp import Client

from bench.common import LoadWatch, percentiles, rotated, write_result
from luftpause.runtime.core import journal
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.file import JournalFile, Store
from luftpause.runtime.journal.postgres import Database, PgJournal
from luftpause.testkit.postgres import Postgres
from luftpause.testkit.procs import free_port
from luftpause.testkit.stack import Launcher, LocalStack
from luftpause.testkit.waits import local_url

WRITERS = 32
FAILOVER_TOOL_SECONDS = 2.0  # the victim's calls are out long enough to be killed in
ENGINE_ARGS = ("--time-scale", "50", "--tool-rounds", "1")
APPEND_METRIC = "luftpause_runtime_journal_append_seconds"


# --- records ----------------------------------------------------------------------------------


def _turn(handle: str, n: int) -> dict[str, Any]:
    d = m.RecordTurn(round=n, assistant=m.assistant_message("x" * 200, ()), usage=m.Usage())
    return journal.turn_record(handle, d)


async def _sequential(store: Store, records: int) -> list[float]:
    """One run's `records` turn records appended one after the other; each append's seconds."""
    handle = f"run-{uuid.uuid4().hex[:12]}"
    spec = m.RunSpec(handle=handle, task="bench", model="sim")
    await store.append(journal.spawned_record(spec), retry=False)
    latencies = []
    for n in range(records):
        started = time.perf_counter()
        await store.append(_turn(handle, n + 1))
        latencies.append(time.perf_counter() - started)
    return latencies


async def _burst(store: Store, records: int) -> float:
    """`WRITERS` runs appending at once, `records` in all; records per second."""
    started = time.perf_counter()
    await asyncio.gather(*(_sequential(store, records // WRITERS) for _ in range(WRITERS)))
    return (records // WRITERS + 1) * WRITERS / (time.perf_counter() - started)


async def records_part(pg_url: str, records: int, repeat: int) -> dict[str, Any]:
    """Per-record latency and records per second: the file, PostgreSQL from one replica, and
    from three replicas at once (each its own `Database`, as three processes would be)."""
    arms = ["file", "postgresql", "postgresql-3"]
    latency: dict[str, list[float]] = {a: [] for a in arms}
    rates: dict[str, list[float]] = {a: [] for a in arms}
    loads: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="bench-fleet-", dir="/var/tmp") as tmp:
        dbs = [Database(pg_url, f"bench-{i}", lease_seconds=60) for i in range(3)]
        for db in dbs:
            await db.connect(wait=30)
        try:
            for i in range(repeat):
                for arm in rotated(arms, i):
                    stores: list[Store]
                    if arm == "file":
                        stores = [JournalFile(Path(tmp), f"r{i}.jsonl")]
                        stores[0].open()
                    else:
                        stores = [PgJournal(db) for db in dbs[: 3 if arm.endswith("-3") else 1]]
                    with LoadWatch() as load:
                        each = await asyncio.gather(*(_sequential(st, records) for st in stores))
                        burst = await asyncio.gather(*(_burst(st, records) for st in stores))
                    latency[arm] += [x for one in each for x in one]
                    rates[arm].append(sum(burst))
                    loads[arm].append(load.summary())
                    for st in stores:
                        st.close()
                    print(f"records {arm}: {percentiles(latency[arm])}", flush=True)
        finally:
            for db in dbs:
                await db.close()
    return {
        arm: {
            "appendMs": percentiles(latency[arm]),
            "writersPerReplica": WRITERS,
            "recordsPerSecond": round(statistics.median(rates[arm]), 1),
            "recordsPerSecondRange": [round(min(rates[arm]), 1), round(max(rates[arm]), 1)],
            "load": loads[arm],
        }
        for arm in arms
    }


# --- processes ----------------------------------------------------------------------------------


class Bed:
    """The stack, the tool server and the runtimes of the process parts."""

    def __init__(self, workdir: Path, exits: AsyncExitStack, pg: Postgres, lease: float) -> None:
        self.workdir = workdir
        self.launcher = Launcher(workdir, exits)
        self.exits = exits
        self.pg = pg
        self.lease = lease
        self.dataplane = ""
        self.tools = ""
        self.names = iter(range(1_000_000))

    async def start(self) -> Bed:
        stack = await LocalStack(self.workdir, engine_args=ENGINE_ARGS, engines=1).start(self.exits)
        await stack.wait_healthy()
        self.dataplane = local_url(stack.dataplane_port)
        return self

    async def tool_server(self, latency: float) -> str:
        port = free_port()
        name = f"tools-{next(self.names)}"
        args = ["fake-mcp", "--port", str(port), "--write-latency", str(latency)]
        await self.launcher.spawn(name, args, local_url(port) + "/health")
        return local_url(port) + "/mcp"

    async def runtime(self, tools: str, database: bool) -> tuple[str, Any]:
        port = free_port()
        name = f"runtime-{next(self.names)}"
        args = ["runtime", "--port", str(port), "--state-dir", str(self.workdir / name)]
        args += ["--dataplane", self.dataplane, "--mcp-server", tools, "--stop-grace", "0"]
        if database:
            args += ["--journal", self.pg.url, "--lease-seconds", str(self.lease)]
            args += ["--replica", name]
        proc = await self.launcher.spawn(name, args, local_url(port) + "/health")
        return local_url(port) + "/mcp", proc


async def _call(url: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    async with asyncio.timeout(300), Client(url) as c:
        result = await c.call_tool(tool, args)
    assert result.structured_content is not None, result.content
    return dict(result.structured_content)


async def _spawn(url: str, tool: str) -> str:
    args = {"task": f"use {tool}", "tools": [tool], "maxToolCalls": 1}
    return str((await _call(url, "spawn", args))["handle"])


async def _spawn_many(urls: list[str], n: int, tool: str) -> list[str]:
    return list(await asyncio.gather(*(_spawn(urls[i % len(urls)], tool) for i in range(n))))


async def _await(url: str, handles: list[str]) -> list[dict[str, Any]]:
    return list((await _call(url, "await", {"handles": handles, "timeout": 280}))["runs"])


async def _append_totals(urls: list[str]) -> tuple[float, float]:
    """(seconds, records) the runtimes' journal-append histograms hold, summed."""
    total = [0.0, 0.0]
    async with aiohttp.ClientSession() as http:
        for url in urls:
            async with http.get(url.removesuffix("/mcp") + "/metrics") as resp:
                text = await resp.text()
            for line in text.splitlines():
                for i, suffix in enumerate(("_sum ", "_count ")):
                    if line.startswith(APPEND_METRIC + suffix):
                        total[i] += float(line.split()[1])
    return total[0], total[1]


async def throughput_part(bed: Bed, runs: int, repeat: int) -> dict[str, Any]:
    """Runs per second, and each journaled record's seconds as the runtimes measured them."""
    tools = await bed.tool_server(0.05)
    arms = {"file-1": (False, 1), "pg-1": (True, 1), "pg-3": (True, 3)}
    urls: dict[str, list[str]] = {}
    for arm, (database, n) in arms.items():
        urls[arm] = [(await bed.runtime(tools, database))[0] for _ in range(n)]
    rates: dict[str, list[float]] = {a: [] for a in arms}
    append_ms: dict[str, list[float]] = {a: [] for a in arms}
    records: dict[str, list[float]] = {a: [] for a in arms}
    unfinished: dict[str, list[int]] = {a: [] for a in arms}
    loads: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for i in range(repeat):
        for arm in rotated(list(arms), i):
            seconds0, count0 = await _append_totals(urls[arm])
            started = time.perf_counter()
            with LoadWatch() as load:
                handles = await _spawn_many(urls[arm], runs, "set_status")
                over = await _await(urls[arm][-1], handles)
            took = time.perf_counter() - started
            loads[arm].append(load.summary())
            done = sum(s["state"] == "finished" for s in over)
            unfinished[arm].append(runs - done)  # not over when the await gave up
            seconds1, count1 = await _append_totals(urls[arm])
            rates[arm].append(done / took)
            append_ms[arm].append(1000 * (seconds1 - seconds0) / (count1 - count0))
            records[arm].append((count1 - count0) / runs)
            print(f"throughput {arm}: {done / took:.1f} runs/s, {runs - done} unfinished, "
                  f"{append_ms[arm][-1]:.2f} ms a record", flush=True)  # fmt: skip
    return {
        arm: {
            "runs": runs,
            "runsPerSecond": round(statistics.median(r), 2),
            "range": [round(min(r), 2), round(max(r), 2)],
            "appendMeanMs": round(statistics.median(append_ms[arm]), 2),
            "appendMeanMsRange": [round(min(append_ms[arm]), 2), round(max(append_ms[arm]), 2)],
            "recordsPerRun": round(statistics.median(records[arm]), 1),
            "unfinished": unfinished[arm],
            "load": loads[arm],
        }
        for arm, r in rates.items()
    }


def _after_kill(pg_url: str, handles: list[str], killed: float) -> dict[str, dict[str, float]]:
    """Per run with rows after the kill: its first row (a survivor took it over) and its
    finished row, in seconds after the kill."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT key, extract(epoch FROM at), record FROM luftpause_journal "
            "WHERE stream = 'runs' AND key = ANY(%s) AND at > to_timestamp(%s) ORDER BY seq",
            (handles, killed),
        ).fetchall()
    out: dict[str, dict[str, float]] = {}
    for key, at, text in rows:
        seen = out.setdefault(key, {"takenOver": float(at) - killed})
        if json.loads(text)["type"] == "finished":
            seen["finished"] = float(at) - killed
    return out


async def _until(probe: Callable[[], Awaitable[bool]], limit: float) -> None:
    async with asyncio.timeout(limit):
        while not await probe():
            await asyncio.sleep(0.02)


async def _calls_out(url: str, handles: list[str]) -> bool:
    """Some of the runs are in a tool round (their calls out)."""
    status = await _call(url, "status", {"handles": handles})
    return any(r["state"] == m.Phase.TOOLS.value for r in status["runs"])


async def failover_part(bed: Bed, repeat: int) -> dict[str, Any]:
    tools = await bed.tool_server(FAILOVER_TOOL_SECONDS)
    replicas = [await bed.runtime(tools, True) for _ in range(3)]
    taken: list[float] = []
    finished: list[float] = []
    for i in range(repeat):
        urls = [u for u, _ in replicas]
        handles = await _spawn_many(urls, 30, "set_status")
        victims = handles[0::3]

        await _until(functools.partial(_calls_out, urls[0], victims), 60)
        await replicas[0][1].kill()
        killed = time.time()
        over = await _await(urls[1], handles)
        assert all(s["state"] == "finished" for s in over), over
        moved = _after_kill(bed.pg.url, victims, killed)
        taken += [x["takenOver"] for x in moved.values()]
        finished += [x["finished"] for x in moved.values()]
        print(f"fail-over {i}: {moved}", flush=True)
        replicas[0] = await bed.runtime(tools, True)
    return {
        "leaseSeconds": bed.lease,
        "toolSeconds": FAILOVER_TOOL_SECONDS,
        "runsMoved": len(taken),
        "secondsFromKillToTakenOver": percentiles(taken, scale=1.0),
        "secondsFromKillToFinished": percentiles(finished, scale=1.0),
    }


async def bench(ns: argparse.Namespace) -> dict[str, Any]:
    pg = Postgres.create()
    pg.start()
    try:
        out: dict[str, Any] = {"repeat": ns.repeat}
        out["records"] = await records_part(pg.url, ns.records, ns.repeat)
        print(json.dumps(out["records"]), flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
            async with AsyncExitStack() as exits:
                bed = await Bed(Path(tmp), exits, pg, ns.lease).start()
                out["throughput"] = await throughput_part(bed, ns.runs, ns.repeat)
                out["failover"] = await failover_part(bed, ns.repeat)
        return out
    finally:
        pg.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--records", type=int, default=300)
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--lease", type=float, default=2.0)
    p.add_argument("--out", default="runtime_fleet", help="result file name (no .json)")
    ns = p.parse_args()
    result = asyncio.run(bench(ns))
    print(write_result(ns.out, result))


if __name__ == "__main__":
    main()
