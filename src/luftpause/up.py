"""`luftpause up`: the whole local stack as child processes, on the ports of DESIGN.md.

Shell module. Each child is its own `luftpause <subcommand>` process with the arguments it
needs (printed at start), so any one of them can be restarted alone with the same command line.
The simulated engines too are started by command line: nothing here imports the test kit.
Without `--config` the engines are simulated (`luftpause fake-engine`, the `gpu` profile unless
`--engine-profile cpu`); with `--config FILE` the stack stands in front of the engines the
endpoint file names and starts none. Each group of children starts once the one before is
ready (`/ready` where a service has one). Ctrl-C or SIGTERM stops all of them; if any child
dies, the whole stack stops with a message naming it and `up` exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shlex
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from luftpause.common import envargs
from luftpause.common.config import ConfigError, load_config
from luftpause.common.procs import ChildFailed, Proc

SIM_MODEL = "luftpause-sim"
# `luftpause fake-engine --profile` names, kept here so the product never imports the test kit
# (tests/test_layout.py checks they are the simulator's).
ENGINE_PROFILES = ("cpu", "gpu")


@dataclass(frozen=True, slots=True, kw_only=True)
class Child:
    name: str
    args: tuple[str, ...]
    ready_url: str


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="luftpause up", description=__doc__)
    p.add_argument(
        "--config",
        metavar="FILE",
        help="endpoint file: stand in front of these engines instead of simulated ones",
    )
    p.add_argument(
        "--state-dir",
        default="state",
        help="where the generated endpoint file and the runtime's journal live",
    )
    p.add_argument("--engines", type=int, default=2, help="simulated engines (default 2)")
    p.add_argument("--engine-port", type=int, default=9001, help="first engine's port")
    p.add_argument(
        "--engine-profile",
        choices=ENGINE_PROFILES,
        default="gpu",
        help="the simulated engines' profile (fake-engine --profile; default gpu: fast replies)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="simulated engines run this many times faster than real time",
    )
    p.add_argument("--dataplane-port", type=int, default=8080, help="the dataplane's port")
    p.add_argument("--grpc-port", type=int, default=5000, help="the scheduler's gRPC port")
    p.add_argument("--http-port", type=int, default=5001, help="the scheduler's HTTP port")
    p.add_argument("--mcp-port", type=int, default=9100, help="the fake MCP server's port")
    p.add_argument("--runtime-port", type=int, default=7000, help="the runtime's port")
    return p


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Options from argv, each defaulting from its `LUFTPAUSE_*` variable."""
    return envargs.parse_args(build_parser(), argv, os.environ if environ is None else environ)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Front:
    """What the stack stands in front of: its endpoint file, the models it serves, and the
    simulated engines to start first (none when the file is the user's)."""

    config: Path
    models: tuple[str, ...]
    engines: tuple[Child, ...]


def front(args: argparse.Namespace) -> Front:
    """The user's endpoint file (`--config`), or simulated engines and a file naming them."""
    if args.config:
        models = load_config(args.config).generative_models()
        return Front(config=Path(args.config), models=models, engines=())
    engines = [(f"engine-{chr(ord('a') + i)}", args.engine_port + i) for i in range(args.engines)]
    config = Path(args.state_dir) / "endpoints.yaml"
    write_config(config, engines)
    sim = ("--model", SIM_MODEL, "--profile", args.engine_profile, "--time-scale")
    children = tuple(
        Child(
            name=eid,
            args=("fake-engine", "--port", str(port), "--id", eid, *sim, str(args.time_scale)),
            ready_url=f"http://127.0.0.1:{port}/health",
        )
        for eid, port in engines
    )
    return Front(config=config, models=(SIM_MODEL,), engines=children)


def plan(args: argparse.Namespace, where: Front) -> list[list[Child]]:
    """The children in start order: each group starts together once the previous is ready."""
    fake_mcp = Child(
        name="fake-mcp",
        args=("fake-mcp", "--port", str(args.mcp_port)),
        ready_url=f"http://127.0.0.1:{args.mcp_port}/health",
    )
    has_runtime = importlib.util.find_spec("luftpause.runtime.main") is not None
    runtime_url = f"http://127.0.0.1:{args.runtime_port}"
    scheduler = Child(
        name="scheduler",
        args=(
            "scheduler",
            "--config",
            str(where.config),
            "--grpc-port",
            str(args.grpc_port),
            "--http-port",
            str(args.http_port),
            # Its status page shows the runtime's run tree.
            *(("--runtime-url", runtime_url) if has_runtime else ()),
        ),
        ready_url=f"http://127.0.0.1:{args.http_port}/ready",
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
            str(where.config),
        ),
        ready_url=f"http://127.0.0.1:{args.dataplane_port}/ready",
    )
    groups = [[*where.engines, fake_mcp], [scheduler], [dataplane]]
    if has_runtime:
        model = where.models[0] if where.models else SIM_MODEL
        # The status page reads /status from its own origin, by either name.
        page_origins = (f"http://127.0.0.1:{args.http_port}", f"http://localhost:{args.http_port}")
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
                        "--model",
                        model,
                        "--state-dir",
                        args.state_dir,
                        *(a for origin in page_origins for a in ("--cors-origin", origin)),
                        # Forecasts read the rate-limit budgets of the scheduler's /status.
                        "--scheduler-url",
                        f"http://127.0.0.1:{args.http_port}",
                    ),
                    ready_url=f"{runtime_url}/ready",
                )
            ]
        )
    return groups


def _say(text: str) -> None:
    print(f"luftpause up: {text}", file=sys.stderr, flush=True)


async def _run(args: argparse.Namespace, where: Front) -> int:
    procs: list[Proc] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        for group in plan(args, where):
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
        _say(_banner(args, where.models))
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


def _banner(args: argparse.Namespace, models: tuple[str, ...]) -> str:
    base = f"http://127.0.0.1:{args.dataplane_port}/v1"
    model = models[0] if models else SIM_MODEL
    return "\n".join(
        [
            "the stack is up.",
            f"  OpenAI-compatible base_url: {base}   (models: {', '.join(models) or 'none'}, "
            + "any api_key)",
            f"  Anthropic base URL:         {base.removesuffix('/v1')}   "
            + f"(Claude Code: ANTHROPIC_BASE_URL, claude --model {model})",
            f"  scheduler status page:      http://127.0.0.1:{args.http_port}/",
            f"  MCP runtime (sub-agents):   http://127.0.0.1:{args.runtime_port}/mcp",
            f"  fake MCP tools:             http://127.0.0.1:{args.mcp_port}/mcp",
            "  try: python -c \"from openai import OpenAI; c = OpenAI(base_url='"
            + base
            + "', api_key='x'); print(c.chat.completions.create(model='"
            + model
            + "', messages=[{'role': 'user', 'content': 'hi'}]).choices[0].message.content)\"",
            "  Ctrl-C stops everything.",
        ]
    )


def main(argv: list[str]) -> int:
    """Run the local stack until Ctrl-C or until a child dies."""
    args = parse_args(argv)
    try:
        where = front(args)
    except ConfigError as exc:
        print(f"luftpause up: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_run(args, where))
