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

import pytest
from openai import AsyncOpenAI

from luftpause.testkit.procs import Proc
from luftpause.testkit.stack import Launcher, write_endpoints
from luftpause.testkit.status import fetch_status
from luftpause.testkit.waits import eventually

MODEL = "worker-model"
WORKERS = {"dp-0", "dp-1"}


def children_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@dataclass
class Workers:
    url: str
    status_url: str
    supervisor: Proc

    async def children(self) -> list[int]:
        return children_of(self.supervisor.pid)

    async def in_session(self, what: str) -> None:
        """Until both workers are in session at the scheduler, as dp-0 and dp-1."""
        await eventually(lambda: dataplanes(self.status_url), lambda ids: ids == WORKERS, what)


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[Workers]:
    async with AsyncExitStack() as exits:
        launcher = Launcher(tmp_path, exits)
        engine = await launcher.engine("e", "--profile", "gpu", models=[MODEL])
        config = write_endpoints(tmp_path / "endpoints.yaml", [engine])
        scheduler = await launcher.scheduler(config, "--probe-period", "0.2", ready="/ready")
        dataplane = await launcher.dataplane(
            scheduler, "--workers", "2", "--id", "dp", ready="/ready"
        )
        yield Workers(dataplane.base_url, scheduler.status_url, launcher.procs["dataplane"])


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
    body = await fetch_status(status_url)
    return {d["id"] for d in body["dataplanes"] if d["streams"]}


async def test_two_workers_share_the_port_each_with_its_own_session(workers: Workers) -> None:
    assert len(await workers.children()) == 2
    await workers.in_session("both workers in session at the scheduler")
    async with asyncio.timeout(60):
        assert len(await turns(workers.url, 20)) == 20


async def test_a_worker_that_dies_is_started_again_and_turns_go_on(workers: Workers) -> None:
    first = await workers.children()
    os.kill(first[0], signal.SIGKILL)  # a child this test's supervisor started
    await eventually(
        workers.children,
        lambda now: len(now) == 2 and first[0] not in now,
        f"the supervisor to start a worker in place of {first[0]}",
    )
    async with asyncio.timeout(60):
        assert len(await turns(workers.url, 10)) == 10
    await workers.in_session("the new worker in session at the scheduler beside the other")


async def test_sigterm_stops_the_supervisor_and_every_worker(workers: Workers) -> None:
    pids = await workers.children()
    code = await workers.supervisor.stop(timeout=20)  # SIGTERM

    async def alive() -> list[int]:
        return [p for p in pids if Path(f"/proc/{p}").exists()]

    await eventually(alive, lambda left: not left, "every worker to exit")
    assert code == 0
