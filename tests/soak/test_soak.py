"""Soak: 64 closed-loop agents for 10 minutes while engines are killed and restarted.

Marked slow: `make test-slow` and `make soak` run it, `make test` does not.
LUFTPAUSE_SOAK_SECONDS shortens or lengthens the window (default 600). Checks, after warm-up:
the resident memory of the scheduler and the dataplane stays flat; once the agents stop and
their runs are deleted, the scheduler holds no run, no turn and no held turn. Writes its figures
to LUFTPAUSE_SOAK_RESULTS (`make soak` sets bench/results/soak.json), else into the test's
temporary directory, so a test run leaves the committed results alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from luftpause.testkit.agents import AgentStats, run_task
from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import SIM_MODEL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

AGENTS = 64
SECONDS = float(os.environ.get("LUFTPAUSE_SOAK_SECONDS", "600"))
RESULTS = os.environ.get("LUFTPAUSE_SOAK_RESULTS", "")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Engines:
    """Two simulated engines on fixed ports, each restartable with its own command line."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = {f"e{i}": free_port() for i in range(2)}
        self.procs: dict[str, Proc] = {}

    def args(self, eid: str) -> list[str]:
        return [
            "fake-engine",
            "--port",
            str(self.ports[eid]),
            "--id",
            eid,
            "--model",
            SIM_MODEL,
            "--tool-rounds",
            "2",
            "--time-scale",
            "10",
        ]

    async def start(self, eid: str) -> None:
        proc = await Proc(self.args(eid), name=eid, log_path=self.workdir / f"{eid}.log").start()
        await proc.wait_http(f"http://127.0.0.1:{self.ports[eid]}/health")
        self.procs[eid] = proc

    async def chaos(self, stop: asyncio.Event, rng: random.Random, log: list[Any]) -> None:
        """Kill -9 a random engine every 20-40 s and restart it 2-5 s later."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=rng.uniform(20, 40))
                return
            except TimeoutError:
                pass
            eid = rng.choice(sorted(self.procs))
            await self.procs[eid].kill()
            down = rng.uniform(2, 5)
            log.append({"t": time.monotonic(), "killed": eid, "down_s": round(down, 1)})
            await asyncio.sleep(down)
            await self.start(eid)

    async def stop_all(self) -> None:
        for proc in self.procs.values():
            await proc.stop()


async def agent(i: int, base_url: str, stop: asyncio.Event, stats: AgentStats) -> None:
    async with (
        AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=60) as c,
        aiohttp.ClientSession() as http,
    ):
        n = 0
        while not stop.is_set():
            n += 1
            run_id = f"soak-{i}-{n}"
            await run_task(
                c,
                stats,
                run_id=run_id,
                model=SIM_MODEL,
                task=f"question {n}",
                headers={
                    "x-luftpause-caller": f"team{i % 8}",
                    "x-luftpause-class": "batch" if i % 4 else "interactive",
                },
            )
            async with http.delete(f"{base_url}/runs/{run_id}") as resp:
                assert resp.status == 200


async def test_memory_stays_flat_and_no_state_leaks_under_engine_chaos(tmp_path: Path) -> None:
    rng = random.Random(7)
    async with AsyncExitStack() as exits:
        engines = Engines(tmp_path)
        for eid in engines.ports:
            await engines.start(eid)
        exits.push_async_callback(engines.stop_all)
        lines = ["endpoints:"] + [
            line
            for eid, port in engines.ports.items()
            for line in (
                f"  - id: {eid}",
                f"    url: http://127.0.0.1:{port}",
                f"    models: [{SIM_MODEL}]",
            )
        ]
        (tmp_path / "endpoints.yaml").write_text("\n".join(lines) + "\n")
        grpc_port, http_port, dp_port = free_port(), free_port(), free_port()
        scheduler = await Proc(
            [
                "scheduler",
                "--config",
                str(tmp_path / "endpoints.yaml"),
                "--grpc-port",
                str(grpc_port),
                "--http-port",
                str(http_port),
            ],
            log_path=tmp_path / "scheduler.log",
        ).start()
        exits.push_async_callback(scheduler.stop)
        dataplane = await Proc(
            ["dataplane", "--port", str(dp_port), "--scheduler", f"127.0.0.1:{grpc_port}"],
            log_path=tmp_path / "dataplane.log",
        ).start()
        exits.push_async_callback(dataplane.stop)
        status_url = f"http://127.0.0.1:{http_port}/status"
        base_url = f"http://127.0.0.1:{dp_port}/v1"
        await scheduler.wait_http(status_url)
        await dataplane.wait_http(f"http://127.0.0.1:{dp_port}/health")

        stop = asyncio.Event()
        stats = AgentStats()
        chaos_log: list[Any] = []
        samples: list[dict[str, Any]] = []
        started = time.monotonic()
        workers = [asyncio.create_task(agent(i, base_url, stop, stats)) for i in range(AGENTS)]
        chaos = asyncio.create_task(engines.chaos(stop, rng, chaos_log))
        async with aiohttp.ClientSession() as http:

            async def status() -> dict[str, Any]:
                async with http.get(status_url) as resp:
                    result: dict[str, Any] = await resp.json()
                    return result

            while time.monotonic() - started < SECONDS:
                await asyncio.sleep(5)
                st = await status()
                samples.append(
                    {
                        "t": round(time.monotonic() - started, 1),
                        "scheduler_mib": rss_mib(scheduler.pid),
                        "dataplane_mib": rss_mib(dataplane.pid),
                        "runs": st["runs_total"],
                        "held": st["held_total"],
                        "in_flight": st["turns_in_flight"],
                        "completed_runs": sum(r.completed for r in stats.runs),
                    }
                )
            stop.set()
            async with asyncio.timeout(120):
                await asyncio.gather(*workers, chaos)
            async with asyncio.timeout(30):
                while (
                    (st := await status())["runs_total"]
                    or st["turns_in_flight"]
                    or st["held_total"]
                ):
                    await asyncio.sleep(0.1)

    def growth(key: str) -> dict[str, float]:
        values = [s[key] for s in samples]
        warm = values[len(values) // 5 : 2 * len(values) // 5] or values[:1]
        last = values[-max(len(values) // 5, 1) :]
        return {
            "after_warmup_mib": round(statistics.median(warm), 1),
            "end_mib": round(statistics.median(last), 1),
            "max_mib": round(max(values), 1),
        }

    completed = [r for r in stats.runs if r.completed]
    result = {
        "seconds": SECONDS,
        "agents": AGENTS,
        "runs": len(stats.runs),
        "completed_runs": len(completed),
        "client_errors_retried": dict(stats.errors),
        "engine_kills": len(chaos_log),
        "scheduler": growth("scheduler_mib"),
        "dataplane": growth("dataplane_mib"),
        "final_status": st,
        "samples": samples,
    }
    out = Path(RESULTS) if RESULTS else tmp_path / "soak.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    assert completed and len(completed) >= 0.95 * len(stats.runs)
    for service in ("scheduler", "dataplane"):
        g = result[service]
        assert isinstance(g, dict)
        assert g["end_mib"] - g["after_warmup_mib"] < max(0.15 * g["after_warmup_mib"], 8.0), (
            f"{service} resident memory grew: {g}"
        )
