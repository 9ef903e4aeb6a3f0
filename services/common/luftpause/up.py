"""`luftpause up`: the whole local stack as child processes, on the ports of DESIGN.md.

Shell module. Each child is its own `luftpause <subcommand>` process with the arguments it
needs (printed at start), so any one of them can be restarted alone with the same command line.
Ctrl-C or SIGTERM stops all of them; if any child dies, the whole stack stops with a message
naming it and `up` exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from luftpause.testkit.procs import ChildFailed, Proc

SIM_MODEL = "luftpause-sim"


@dataclass(frozen=True, slots=True, kw_only=True)
class Child:
    name: str
    args: tuple[str, ...]
    ready_url: str


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="luftpause up", description=__doc__)
    p.add_argument("--state-dir", default="state", help="where the generated config lives")
    p.add_argument("--engines", type=int, default=2, help="simulated engines (default 2)")
    p.add_argument("--engine-port", type=int, default=9001, help="first engine's port")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="simulated engines run this many times faster than real time",
    )
    p.add_argument("--dataplane-port", type=int, default=8080)
    p.add_argument("--grpc-port", type=int, default=5000)
    p.add_argument("--http-port", type=int, default=5001)
    p.add_argument("--mcp-port", type=int, default=9100)
    p.add_argument("--runtime-port", type=int, default=7000)
    return p.parse_args(argv)


def write_config(path: Path, engines: list[tuple[str, int]]) -> None:
    """The endpoint file for the simulated engines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Written by `luftpause up`: the simulated engines of the local stack.", "endpoints:"]
    for eid, port in engines:
        lines += [
            f"  - id: {eid}",
            f"    url: http://127.0.0.1:{port}",
            f"    models: [{SIM_MODEL}]",
            "    kind: generative",
            "    health: /health",
        ]
    path.write_text("\n".join(lines) + "\n")


def plan(args: argparse.Namespace) -> list[list[Child]]:
    """The children in start order: each group starts together once the previous is ready."""
    engines = [(f"engine-{chr(ord('a') + i)}", args.engine_port + i) for i in range(args.engines)]
    config = Path(args.state_dir) / "endpoints.yaml"
    write_config(config, engines)
    scale = ("--time-scale", str(args.time_scale))
    first = [
        Child(
            name=eid,
            args=("fake-engine", "--port", str(port), "--id", eid, "--model", SIM_MODEL, *scale),
            ready_url=f"http://127.0.0.1:{port}/health",
        )
        for eid, port in engines
    ]
    first.append(
        Child(
            name="fake-mcp",
            args=("fake-mcp", "--port", str(args.mcp_port)),
            ready_url=f"http://127.0.0.1:{args.mcp_port}/health",
        )
    )
    scheduler = Child(
        name="scheduler",
        args=(
            "scheduler",
            "--config",
            str(config),
            "--grpc-port",
            str(args.grpc_port),
            "--http-port",
            str(args.http_port),
        ),
        ready_url=f"http://127.0.0.1:{args.http_port}/health",
    )
    dataplane = Child(
        name="dataplane",
        args=(
            "dataplane",
            "--port",
            str(args.dataplane_port),
            "--scheduler",
            f"127.0.0.1:{args.grpc_port}",
            "--config",
            str(config),
        ),
        ready_url=f"http://127.0.0.1:{args.dataplane_port}/health",
    )
    groups = [first, [scheduler], [dataplane]]
    if importlib.util.find_spec("luftpause.runtime.main") is not None:
        groups.append(
            [
                Child(
                    name="runtime",
                    args=(
                        "runtime",
                        "--port",
                        str(args.runtime_port),
                        "--dataplane",
                        f"http://127.0.0.1:{args.dataplane_port}",
                        "--mcp-server",
                        f"http://127.0.0.1:{args.mcp_port}/mcp",
                    ),
                    ready_url=f"http://127.0.0.1:{args.runtime_port}/health",
                )
            ]
        )
    return groups


def _say(text: str) -> None:
    print(f"luftpause up: {text}", file=sys.stderr, flush=True)


async def _run(args: argparse.Namespace) -> int:
    procs: list[Proc] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        for group in plan(args):
            if stop.is_set():
                return 0
            started = []
            for child in group:
                _say(f"starting {child.name}: luftpause {shlex.join(child.args)}")
                started.append(
                    await Proc(
                        child.args, name=child.name, inherit_output=True, own_session=True
                    ).start()
                )
            procs += started
            await asyncio.gather(
                *(
                    p.wait_http(c.ready_url, timeout=30.0)
                    for p, c in zip(started, group, strict=True)
                )
            )
        _say(_banner(args))
        return await _watch(procs, stop)
    except ChildFailed as exc:
        _say(f"{exc}; stopping the stack")
        return 1
    finally:
        for p in reversed(procs):
            await p.stop()
        _say("stopped")


async def _watch(procs: list[Proc], stop: asyncio.Event) -> int:
    """Wait for Ctrl-C (exit 0) or for any child to die (exit 1)."""
    stopper = asyncio.create_task(stop.wait())
    waits = {asyncio.create_task(p.proc.wait()): p for p in procs if p.proc is not None}
    done, _ = await asyncio.wait({stopper, *waits}, return_when=asyncio.FIRST_COMPLETED)
    for task in (stopper, *waits):
        task.cancel()
    dead = [waits[t] for t in done if t in waits]
    if dead:
        p = dead[0]
        code = p.proc.returncode if p.proc else None
        _say(f"{p.name} exited with code {code}; stopping the whole stack")
        return 1
    return 0


def _banner(args: argparse.Namespace) -> str:
    base = f"http://127.0.0.1:{args.dataplane_port}/v1"
    return "\n".join(
        [
            "the stack is up.",
            f"  OpenAI-compatible base_url: {base}   (model: {SIM_MODEL}, any api_key)",
            f"  scheduler status page:      http://127.0.0.1:{args.http_port}/",
            f"  MCP runtime (sub-agents):   http://127.0.0.1:{args.runtime_port}/mcp",
            f"  fake MCP tools:             http://127.0.0.1:{args.mcp_port}/mcp",
            "  try: python -c \"from openai import OpenAI; c = OpenAI(base_url='"
            + base
            + "', api_key='x'); print(c.chat.completions.create(model='"
            + SIM_MODEL
            + "', messages=[{'role': 'user', 'content': 'hi'}]).choices[0].message.content)\"",
            "  Ctrl-C stops everything.",
        ]
    )


def main(argv: list[str]) -> int:
    """Run the local stack until Ctrl-C or until a child dies."""
    return asyncio.run(_run(parse_args(argv)))
