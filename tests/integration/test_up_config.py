"""`luftpause up --config FILE`: the local stack in front of engines it did not start.

Two simulators (the `gpu` profile, real time) are started here; `up` gets an endpoint file
naming them, starts the scheduler, dataplane, runtime and fake MCP server (and no engine), and
stops on SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from luftpause.testkit.procs import Proc, free_port

MODEL = "demo-model"


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[Path]:
    """Two running simulators and an endpoint file naming them."""
    async with AsyncExitStack() as exits:
        lines = ["endpoints:"]
        for eid in ("sim-a", "sim-b"):
            port = free_port()
            args = ["fake-engine", "--port", str(port), "--id", eid, "--model", MODEL]
            proc = await Proc([*args, "--profile", "gpu"], log_path=tmp_path / f"{eid}.log").start()
            exits.push_async_callback(proc.stop)
            await proc.wait_http(f"http://127.0.0.1:{port}/health", timeout=30)
            lines += [f"  - id: {eid}", f"    url: http://127.0.0.1:{port}"]
            lines += [f"    models: [{MODEL}]"]
        config = tmp_path / "endpoints.yaml"
        config.write_text("\n".join(lines) + "\n")
        yield config


def children_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def gone(pids: list[int]) -> None:
    async with asyncio.timeout(15):
        while any(Path(f"/proc/{p}").exists() and " Z " not in _stat(p) for p in pids):
            await asyncio.sleep(0.05)


def _stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return " Z "


async def test_up_with_a_config_fronts_those_engines_and_stops_on_sigint(
    engines: Path, tmp_path: Path
) -> None:
    ports = {name: free_port() for name in ("dataplane", "grpc", "http", "mcp", "runtime")}
    log = tmp_path / "up.log"
    up = await Proc(
        [
            "up",
            "--config",
            str(engines),
            "--state-dir",
            str(tmp_path / "state"),
            *("--dataplane-port", str(ports["dataplane"]), "--grpc-port", str(ports["grpc"])),
            *("--http-port", str(ports["http"]), "--mcp-port", str(ports["mcp"])),
            *("--runtime-port", str(ports["runtime"])),
        ],
        log_path=log,
    ).start()
    try:
        async with asyncio.timeout(60):
            while "the stack is up" not in log.read_text():
                assert up.running, log.read_text()
                await asyncio.sleep(0.05)
        children = children_of(up.pid)
        assert len(children) == 4  # scheduler, dataplane, runtime, fake-mcp: no engine
        text = log.read_text()
        assert "fake-engine" not in text and f"--config {engines}" in text
        assert f"models: {MODEL}" in text

        base = f"http://127.0.0.1:{ports['dataplane']}/v1"
        async with (
            asyncio.timeout(30),
            AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as client,
        ):
            listed = [m.id async for m in client.models.list()]
            started = time.monotonic()
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
            )
            first, content = None, ""
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first or time.monotonic() - started
                    content += chunk.choices[0].delta.content
        assert listed == [MODEL] and content
        assert first is not None and first < 3.0  # the gpu profile: milliseconds, simulated

        assert up.proc is not None
        up.proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            assert await up.proc.wait() == 0
        await gone(children)
    finally:
        await up.stop()
