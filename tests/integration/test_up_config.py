"""`luftpause up --config FILE`: the local stack in front of engines it did not start.

Two simulators (the `gpu` profile, real time) are started here; `up` gets an endpoint file
naming them, starts the scheduler, dataplane, runtime and fake MCP server (and no engine), and
stops on SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import Launcher, write_endpoints
from luftpause.testkit.waits import eventually, read_metrics

MODEL = "demo-model"


@dataclass(frozen=True, slots=True, kw_only=True)
class Engines:
    config: Path
    urls: tuple[str, ...]


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[Engines]:
    """Two running simulators and an endpoint file naming them."""
    async with AsyncExitStack() as exits:
        launcher = Launcher(tmp_path, exits)
        endpoints = [
            await launcher.engine(eid, "--profile", "gpu", models=[MODEL])
            for eid in ("sim-a", "sim-b")
        ]
        config = write_endpoints(tmp_path / "endpoints.yaml", endpoints)
        yield Engines(config=config, urls=tuple(e.url for e in endpoints))


async def busy_ms(engines: Engines) -> float:
    """Simulated milliseconds the engines spent working, by their own clock."""
    metrics = [await read_metrics(url + "/metrics") for url in engines.urls]
    return sum(m["luftpause_sim_busy_ms_total"] for m in metrics)


def children_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def gone(pids: list[int]) -> None:
    async def alive() -> list[int]:
        return [p for p in pids if Path(f"/proc/{p}").exists() and " Z " not in _stat(p)]

    await eventually(alive, lambda left: not left, "every child of `up` to exit")


def _stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return " Z "


async def test_up_with_a_config_fronts_those_engines_and_stops_on_sigint(
    engines: Engines, tmp_path: Path
) -> None:
    ports = {name: free_port() for name in ("dataplane", "grpc", "http", "mcp", "runtime")}
    log = tmp_path / "up.log"
    up = await Proc(
        [
            "up",
            "--config",
            str(engines.config),
            "--state-dir",
            str(tmp_path / "state"),
            *("--dataplane-port", str(ports["dataplane"]), "--grpc-port", str(ports["grpc"])),
            *("--http-port", str(ports["http"]), "--mcp-port", str(ports["mcp"])),
            *("--runtime-port", str(ports["runtime"])),
        ],
        log_path=log,
    ).start()
    try:

        async def up_log() -> str:
            assert up.running, log.read_text()
            return log.read_text()

        await eventually(
            up_log, lambda text: "the stack is up" in text, "`up` to log that the stack is up"
        )
        children = children_of(up.pid)
        assert len(children) == 4  # scheduler, dataplane, runtime, fake-mcp: no engine
        text = log.read_text()
        assert "fake-engine" not in text and f"--config {engines.config}" in text
        assert f"models: {MODEL}" in text

        base = f"http://127.0.0.1:{ports['dataplane']}/v1"
        async with (
            asyncio.timeout(30),
            AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as client,
        ):
            listed = [m.id async for m in client.models.list()]
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
            )
            content = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert listed == [MODEL] and content
        # Served by the engines in the file, on the gpu profile: about 120 ms by their own clock
        # (the cpu profile's 450), whatever this machine's clock says.
        assert 0 < await busy_ms(engines) < 250

        assert up.proc is not None
        up.proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            assert await up.proc.wait() == 0
        await gone(children)
    finally:
        await up.stop()
