"""The arms of the flood benchmarks: each arm's front, started against fresh engines.

Shell module used by bench.flood and bench.flood_mcp. `start_engines` starts two engine
simulators with the benchmark's GPU-class profile; `start_front` starts what an arm puts in
front of them: sglang-router (cache_aware or round_robin, its clients sending the engine
priority or not), or a scheduler and a dataplane (luftpause, or an ablation with a rule switched
off: `ABLATIONS`, or without engine priority). Every process is stopped when the caller's exit
stack closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import SIM_MODEL

# A GPU-class engine (the seed's test bed was SGLang with a 1B model on a laptop GPU), not the
# CPU llama.cpp calibration: with CPU speeds this workload never finishes a run in a window.
GPU_PROFILE = (
    "--prefill-ms-per-token",
    "0.1",
    "--decode-base-ms",
    "15",
    "--decode-ms-per-seq",
    "0.3",
)
ARMS = (
    "router-cache_aware",
    "router-cache_aware-priority",
    "router-round_robin",
    "luftpause-free",
    "luftpause-nopriority",
    "luftpause-nokv",
    "luftpause-nosoft",
    "luftpause-noopenings",
    "luftpause-noshare",
    "luftpause-headroom",
    "luftpause-noslots",
    "luftpause-nosaves",
    "luftpause",
)
# The scheduler's rules each ablation arm switches (`luftpause scheduler --without/--with`).
ABLATIONS: dict[str, tuple[str, ...]] = {
    "luftpause-free": ("--without", "affinity,soft_affinity"),
    "luftpause-nokv": ("--without", "kv_rule"),
    "luftpause-nosoft": ("--without", "soft_affinity"),
    "luftpause-noopenings": ("--without", "openings"),
    "luftpause-noshare": ("--without", "share"),
    "luftpause-headroom": ("--with", "headroom"),
}
# A router arm whose clients send the engine `priority` of their turn's class in the body, as a
# router user who knows the class would. sglang-router 0.3.2 drops the field on its way to the
# engine (bench.router_fields shows it): the arm is kept to show that it equals plain cache_aware.
CLIENT_PRIORITY = "-priority"


def router_policy(arm: str) -> str:
    """The sglang-router policy of a router arm (`router-<policy>[-priority]`)."""
    return arm.removeprefix("router-").removesuffix(CLIENT_PRIORITY)


# With --engine-priority (the simulated pool's default) every arm's engines schedule by the
# request's `priority` as SGLang with --enable-priority-scheduling and
# --schedule-low-priority-values-first does (the seed's test bed ran SGLang with priority
# scheduling in every row): lower first in the queue, and a waiting request preempts a running
# one worse by more than SGLang's default threshold of 10. Requests without one are all equal
# (0), so the routers' arms stay first come, first served and never preempt. luftpause's
# endpoints send these numbers and say the engine preempts, except in luftpause-nopriority.
ENGINE_PRIORITY = {"interactive": 0, "batch": 100}
ENGINE_PRIORITY_ARGS = (
    "--priority-scheduling",
    "low-first",
    "--priority-preemption-threshold",
    "10",
)


@dataclass(frozen=True, slots=True)
class Front:
    """What an arm put in front of the engines: its URL (no `/v1`), and for luftpause's arms
    its scheduler's HTTP base URL (`/status`, `/metrics`); None for a router."""

    url: str
    scheduler: str | None = None


async def _router(exits: AsyncExitStack, workdir: Path, policy: str, engines: list[str]) -> str:
    port = free_port()
    log = open(workdir / f"router-{policy}.log", "ab")  # noqa: SIM115
    exits.callback(log.close)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-port",
        str(free_port()),
        "--policy",
        policy,
        "--worker-urls",
        *engines,
        "--log-level",
        "warn",
        stdout=log,
        stderr=log,
        stdin=asyncio.subprocess.DEVNULL,
    )

    async def stop() -> None:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()

    exits.push_async_callback(stop)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as s, asyncio.timeout(60):
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(url + "/v1/models") as resp:
                    if resp.status == 200:
                        return url
            await asyncio.sleep(0.2)


async def _spawn(
    exits: AsyncExitStack, workdir: Path, name: str, args: list[str], ready: str
) -> None:
    proc = await Proc(args, name=name, log_path=workdir / f"{name}.log").start()
    exits.push_async_callback(proc.stop)
    await proc.wait_http(ready, timeout=60)


async def start_engines(
    exits: AsyncExitStack, workdir: Path, name: str, args: argparse.Namespace, *extra: str
) -> list[str]:
    """Two fresh engine simulators with the benchmark's profile; their base URLs."""
    engines = []
    model_flags = tuple(getattr(args, "engine_flags", ()))
    for i in range(2):
        port = free_port()
        await _spawn(
            exits,
            workdir,
            f"{name}-e{i}",
            [
                "fake-engine",
                "--port",
                str(port),
                "--id",
                f"e{i}",
                "--model",
                SIM_MODEL,
                "--time-scale",
                str(args.time_scale),
                "--kv-tokens",
                str(args.kv_tokens),
                "--max-running",
                str(args.max_running),
                "--admission",
                getattr(args, "admission", "reserve"),
                "--stream-interval",
                str(getattr(args, "stream_interval", 1)),
                # Routers drop the loadgen's x-sim-* headers: the engines default to its script.
                "--tool-style",
                getattr(args, "tool_style", "openai"),
                "--tool-rounds",
                str(getattr(args, "tool_calls", 3)),
                *GPU_PROFILE,
                # An engine model of the family (bench.engine_models) carries its own queue
                # order; its flags come last and win.
                *(ENGINE_PRIORITY_ARGS if args.engine_priority and not model_flags else ()),
                *model_flags,
                *extra,
            ],
            f"http://127.0.0.1:{port}/health",
        )
        engines.append(f"http://127.0.0.1:{port}")
    return engines


async def start_front(
    exits: AsyncExitStack,
    workdir: Path,
    arm: str,
    engines: list[str],
    model: str,
    probe_period: float,
    *,
    engine_priority: bool = False,
    preemptive: bool = True,
    slots: int = 0,
    slot_saves: int = 0,
) -> Front:
    """What the arm puts in front of `engines`: a router or scheduler + dataplane.
    `probe_period` is the scheduler's, in real seconds. With
       `engine_priority` the luftpause arms but luftpause-nopriority send ENGINE_PRIORITY (and
       say the engine preempts when `preemptive`); with
       `slots` (llama.cpp's --parallel) they but luftpause-noslots assign the engines' slots, and
       with `slot_saves` too they but luftpause-noslots and luftpause-nosaves keep that many saved
       slot contexts per engine (its --slot-save-path).
    """
    if arm.startswith("router-"):
        return Front(await _router(exits, workdir, router_policy(arm), engines))
    priority = ""
    if engine_priority and arm != "luftpause-nopriority":
        numbers = ", ".join(f"{k}: {v}" for k, v in ENGINE_PRIORITY.items())
        priority = f"    priority: {{{numbers}, preemptive: {str(preemptive).lower()}}}\n"
    if slots and arm != "luftpause-noslots":
        priority += f"    slots: {slots}\n"
        if slot_saves and arm != "luftpause-nosaves":
            priority += f"    slot_saves: {slot_saves}\n"
    config = workdir / f"{arm}.yaml"
    config.write_text(
        "endpoints:\n"
        + "".join(
            f"  - id: e{i}\n    url: {url}\n    models: [{model}]\n{priority}"
            for i, url in enumerate(engines)
        )
    )
    grpc_port, http_port, dp_port = free_port(), free_port(), free_port()
    extra = ["--probe-period", str(probe_period), *ABLATIONS.get(arm, ())]
    await _spawn(
        exits,
        workdir,
        f"{arm}-scheduler",
        [
            "scheduler",
            "--config",
            str(config),
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
            *extra,
        ],
        f"http://127.0.0.1:{http_port}/health",
    )
    await _spawn(
        exits,
        workdir,
        f"{arm}-dataplane",
        ["dataplane", "--port", str(dp_port), "--scheduler", f"127.0.0.1:{grpc_port}"],
        f"http://127.0.0.1:{dp_port}/health",
    )
    await asyncio.sleep(probe_period + 0.5)  # one probe period, so the scheduler saw the engines
    return Front(f"http://127.0.0.1:{dp_port}", f"http://127.0.0.1:{http_port}")
