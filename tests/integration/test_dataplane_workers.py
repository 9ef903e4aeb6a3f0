"""`luftpause dataplane --workers 2`: two dataplane processes on one port, supervised.

Real processes: a simulator, a scheduler, and the dataplane's supervisor with its two workers.
Connections spread over both workers (each is its own dataplane at the scheduler), a worker that
dies is started again while turns keep being served, and SIGTERM stops them all.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from luftpause.testkit.procs import Proc, free_port

MODEL = "worker-model"


def children_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@dataclass
class Workers:
    url: str
    status_url: str
    supervisor: Proc


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[Workers]:
    async with AsyncExitStack() as exits:
        engine_port, grpc, http, port = free_port(), free_port(), free_port(), free_port()
        engine = await Proc(
            ["fake-engine", "--port", str(engine_port), "--model", MODEL, "--profile", "gpu"],
            log_path=tmp_path / "engine.log",
        ).start()
        exits.push_async_callback(engine.stop)
        config = tmp_path / "endpoints.yaml"
        config.write_text(
            f"endpoints:\n  - id: e\n    url: http://127.0.0.1:{engine_port}\n"
            f"    models: [{MODEL}]\n"
        )
        scheduler = await Proc(
            [
                *("scheduler", "--config", str(config), "--grpc-port", str(grpc)),
                *("--http-port", str(http), "--probe-period", "0.2"),
            ],
            log_path=tmp_path / "scheduler.log",
        ).start()
        exits.push_async_callback(scheduler.stop)
        await scheduler.wait_http(f"http://127.0.0.1:{http}/ready", timeout=30)
        supervisor = await Proc(
            [
                *("dataplane", "--port", str(port), "--scheduler", f"127.0.0.1:{grpc}"),
                *("--workers", "2", "--id", "dp"),
            ],
            log_path=tmp_path / "dataplane.log",
        ).start()
        exits.push_async_callback(supervisor.stop)
        await supervisor.wait_http(f"http://127.0.0.1:{port}/ready", timeout=30)
        yield Workers(f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{http}/status", supervisor)


async def turns(url: str, count: int) -> set[str]:
    """`count` turns, each on a connection of its own; the run ids they were given."""
    runs = set()
    for _ in range(count):
        async with AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=30) as client:
            reply = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            runs.add(reply.headers["x-luftpause-run-id"])
    return runs


async def dataplanes(status_url: str) -> set[str]:
    async with aiohttp.ClientSession() as s, s.get(status_url) as resp:
        body = await resp.json()
    return {d["id"] for d in body["dataplanes"] if d["streams"]}


async def test_two_workers_share_the_port_each_with_its_own_session(workers: Workers) -> None:
    async with asyncio.timeout(60):
        assert len(children_of(workers.supervisor.pid)) == 2
        while await dataplanes(workers.status_url) != {"dp-0", "dp-1"}:
            await asyncio.sleep(0.1)
        assert len(await turns(workers.url, 20)) == 20


async def test_a_worker_that_dies_is_started_again_and_turns_go_on(workers: Workers) -> None:
    async with asyncio.timeout(60):
        first = children_of(workers.supervisor.pid)
        os.kill(first[0], signal.SIGKILL)  # a child this test's supervisor started
        while True:
            now = children_of(workers.supervisor.pid)
            if len(now) == 2 and first[0] not in now:
                break
            await asyncio.sleep(0.05)
        assert len(await turns(workers.url, 10)) == 10
        while await dataplanes(workers.status_url) != {"dp-0", "dp-1"}:
            await asyncio.sleep(0.1)


async def test_sigterm_stops_the_supervisor_and_every_worker(workers: Workers) -> None:
    pids = children_of(workers.supervisor.pid)
    async with asyncio.timeout(30):
        code = await workers.supervisor.stop(timeout=20)  # SIGTERM
        while any(Path(f"/proc/{p}").exists() for p in pids):
            await asyncio.sleep(0.05)
    assert code == 0
