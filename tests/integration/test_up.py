"""`luftpause up`: the whole local stack as child processes, stopped as one."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.waits import READY_SECONDS, eventually
from luftpause.up import front, parse_args, plan


@dataclass
class Up:
    proc: Proc
    log: Path
    dataplane: int

    def children(self) -> list[int]:
        """PIDs of the processes `up` started (read from /proc, Linux)."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(p) for p in path.read_text().split()]


@pytest.fixture
async def up(tmp_path: Path) -> AsyncIterator[Up]:
    ports = {name: free_port() for name in ("dataplane", "grpc", "http", "mcp", "runtime")}
    engine = free_port(2)  # `up` puts its engines on this port and the next
    args = [
        "up",
        "--state-dir",
        str(tmp_path / "state"),
        "--engine-port",
        str(engine),
        "--time-scale",
        "20",
        "--dataplane-port",
        str(ports["dataplane"]),
        "--grpc-port",
        str(ports["grpc"]),
        "--http-port",
        str(ports["http"]),
        "--mcp-port",
        str(ports["mcp"]),
        "--runtime-port",
        str(ports["runtime"]),
    ]
    log = tmp_path / "up.log"
    proc = await Proc(args, log_path=log).start()
    try:
        await proc.wait_http(f"http://127.0.0.1:{ports['dataplane']}/health", READY_SECONDS)
        await eventually(
            lambda: asyncio.to_thread(log.read_text),
            lambda text: "the stack is up" in text,
            "`up` to log that the stack is up",
        )
        yield Up(proc, log, ports["dataplane"])
    finally:
        await proc.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and " Z " not in Path(f"/proc/{pid}/stat").read_text()


async def _gone(pids: list[int]) -> None:
    async def alive() -> list[int]:
        return [p for p in pids if _alive(p)]

    await eventually(alive, lambda left: not left, "every child of `up` to exit")


async def test_up_serves_completions_and_stops_everything_on_sigterm(up: Up) -> None:
    children = up.children()
    assert len(children) >= 5  # two engines, fake-mcp, scheduler, dataplane
    async with (
        asyncio.timeout(30),
        AsyncOpenAI(base_url=f"http://127.0.0.1:{up.dataplane}/v1", api_key="x") as c,
    ):
        reply = await c.chat.completions.create(
            model="luftpause-sim", messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.choices[0].message.content
    text = up.log.read_text()
    assert f"base_url: http://127.0.0.1:{up.dataplane}/v1" in text
    assert "luftpause fake-engine --port" in text  # each child's own command line is printed
    assert "--profile gpu" in text  # simulated engines answer fast unless told otherwise
    assert up.proc.proc is not None
    up.proc.proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        assert await up.proc.proc.wait() == 0
    await _gone(children)


async def test_up_stops_the_whole_stack_when_a_child_dies(up: Up) -> None:
    children = up.children()
    scheduler = next(p for p in children if b"scheduler" in Path(f"/proc/{p}/cmdline").read_bytes())
    os.kill(scheduler, signal.SIGKILL)
    assert up.proc.proc is not None
    async with asyncio.timeout(30):
        assert await up.proc.proc.wait() == 1
    await _gone(children)
    assert "scheduler exited with code -9; stopping the whole stack" in up.log.read_text()


def test_up_simulates_gpu_engines_unless_told_to_use_the_cpu_profile(tmp_path: Path) -> None:
    state = ["--state-dir", str(tmp_path)]
    for argv, profile in ((state, "gpu"), ([*state, "--engine-profile", "cpu"], "cpu")):
        where = front(parse_args(argv, {}))
        assert len(where.engines) == 2 and where.models == ("luftpause-sim",)
        for engine in where.engines:
            assert engine.args[engine.args.index("--profile") + 1] == profile


def test_up_with_a_config_starts_no_engines_and_hands_the_file_on(tmp_path: Path) -> None:
    config = tmp_path / "endpoints.yaml"
    config.write_text(
        "endpoints:\n"
        "  - {id: a, url: 'http://127.0.0.1:1', models: [zeta, alpha]}\n"
        "  - {id: c, url: 'http://127.0.0.1:2', models: [clf], kind: single-pass}\n"
    )
    args = parse_args(["--config", str(config), "--state-dir", str(tmp_path / "state")], {})
    where = front(args)
    assert where.engines == () and where.models == ("alpha", "zeta")
    groups = plan(args, where)
    children = {c.name: c for group in groups for c in group}
    assert set(children) == {"fake-mcp", "scheduler", "dataplane", "runtime"}
    for name in ("scheduler", "dataplane"):
        assert children[name].args[children[name].args.index("--config") + 1] == str(config)
        assert children[name].ready_url.endswith("/ready")
    runtime = children["runtime"].args
    assert runtime[runtime.index("--model") + 1] == "alpha"
    assert not (tmp_path / "state").exists()  # nothing generated


def test_up_points_the_status_page_at_its_runtime_and_the_runtime_lets_it_read(
    tmp_path: Path,
) -> None:
    ports = ["--http-port", "5101", "--runtime-port", "7101"]
    args = parse_args([*ports, "--state-dir", str(tmp_path / "state")], {})
    children = {c.name: c.args for group in plan(args, front(args)) for c in group}
    scheduler, runtime = children["scheduler"], children["runtime"]
    assert scheduler[scheduler.index("--runtime-url") + 1] == "http://127.0.0.1:7101"
    origins = [runtime[i + 1] for i, a in enumerate(runtime) if a == "--cors-origin"]
    assert origins == ["http://127.0.0.1:5101", "http://localhost:5101"]
    assert runtime[runtime.index("--scheduler-url") + 1] == "http://127.0.0.1:5101"
