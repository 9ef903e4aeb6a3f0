"""Where sglang-router's time to first byte goes: one stream at a time, the suspects varied.

Run: `.venv/bin/python -m bench.router_ttfb [--rounds 5] [--requests 100] [--router-flags "..."]`.
Writes bench/results/router_ttfb.json (`--out` for another name).

`bench.overhead` found sglang-router adding about 43 ms to the first chunk of a stream at one
client and under 1 ms to a non-streamed reply. Here one instant simulated engine (the overhead
benchmark's: no prefill or decode time, 16-chunk streams) sits behind the repo's dataplane and
two sglang-routers started as their README starts them (`--policy cache_aware`, the default, and
`round_robin`, the policy `bench.overhead` used), plus `--router-flags`. One client, one request
at a time, each arm on a connection of its own, warmed before it is timed; the arms in a rotated
order each round. The arms vary one thing each against `router-cache_aware`:

- `direct`, `luftpause`: the engine itself, and through a scheduler and dataplane;
- `router-round_robin`: the policy (and with it the prefix tree `cache_aware` keeps);
- `router-nodelay`: the same router process with TCP_NODELAY set from outside
  (`bench.sockets`) on the one socket it accepted for this client, nothing else changed;
- `router-fresh`: a new connection for every request instead of one kept alive;
- `router-openai`, `direct-openai`: the official `openai` client (httpx) instead of aiohttp;
- `router-nonstream`, `direct-nonstream`: the same request without `stream`.

Every arm also records the TCP_NODELAY its server's accepted socket carried before anything
was changed (read through `pidfd_getfd`, needs root or CAP_SYS_PTRACE), the ACKs the kernel sent
on its delayed-ACK timer per timed request (the whole machine's, so other traffic shows too),
and the machine's load while it ran. Time to first byte is to the first chunk of the body, as
in `bench.overhead`.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import uvloop
from openai import AsyncOpenAI

from bench.common import LoadWatch, percentiles, rotated, write_result
from bench.overhead import INSTANT, body, one, summarize
from bench.sockets import delayed_acks, ends_towards, nodelay, set_nodelay
from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import SIM_MODEL, LocalStack

ROUTER_POLICIES = ("cache_aware", "round_robin")
WARM = 3  # requests on an arm's connection before it is timed


@dataclass(frozen=True, slots=True)
class Arm:
    """One way of sending the request: to which front, streamed or not, how the client
    connects, and whether the front's accepted socket gets TCP_NODELAY first."""

    name: str
    front: str  # "engine", "luftpause" or "router-<policy>"
    stream: bool = True
    reuse: bool = True  # one kept-alive connection (False: a new one per request)
    nodelay: bool = False  # TCP_NODELAY set on the front's accepted socket before timing
    client: str = "aiohttp"  # or "openai"

    @property
    def baseline(self) -> str:
        """The direct arm this arm's added time is measured against."""
        if self.client == "openai":
            return "direct-openai"
        return "direct" if self.stream else "direct-nonstream"


ARMS = (
    Arm("direct", "engine"),
    Arm("luftpause", "luftpause"),
    Arm("router-cache_aware", "router-cache_aware"),
    Arm("router-round_robin", "router-round_robin"),
    Arm("router-nodelay", "router-cache_aware", nodelay=True),
    Arm("router-fresh", "router-cache_aware", reuse=False),
    Arm("direct-openai", "engine", client="openai"),
    Arm("router-openai", "router-cache_aware", client="openai"),
    Arm("direct-nonstream", "engine", stream=False),
    Arm("router-nonstream", "router-cache_aware", stream=False),
)
BY_NAME = {arm.name: arm for arm in ARMS}


def with_baselines(names: Iterable[str]) -> list[Arm]:
    """The arms named, in ARMS' order, with the direct arm each is measured against."""
    chosen = {BY_NAME[name] for name in names}
    chosen |= {BY_NAME[arm.baseline] for arm in chosen}
    return [arm for arm in ARMS if arm in chosen]


@dataclass(frozen=True, slots=True)
class Front:
    url: str  # the chat completions URL
    pid: int  # the process whose accepted sockets the client talks to
    command: tuple[str, ...] = ()


def router_command(policy: str, port: int, engine: str, extra: list[str]) -> list[str]:
    """sglang-router's command line as its README starts it, on loopback, plus `extra`."""
    return [
        *(sys.executable, "-m", "sglang_router.launch_router"),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--policy", policy, "--worker-urls", engine),
        *("--prometheus-port", str(free_port()), "--log-level", "warn"),
        *extra,
    ]


async def start_router(
    stack: AsyncExitStack, workdir: Path, policy: str, engine: str, extra: list[str]
) -> Front:
    port = free_port()
    command = router_command(policy, port, engine, extra)
    proc = Proc(
        command[1:],
        name=f"router-{policy}",
        program=command[:1],
        log_path=workdir / f"router-{policy}.log",
    )
    await proc.start()
    stack.push_async_callback(proc.stop)
    await proc.wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=120)
    return Front(f"http://127.0.0.1:{port}/v1/chat/completions", proc.pid, tuple(command))


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


Send = Callable[[], Awaitable[tuple[float, float]]]


async def _timed(
    arm: Arm, front: Front, requests: int, send: Send, reused: bool
) -> tuple[list[float], list[float], list[int] | None, float]:
    """Warm the arm's connection, read (and for `router-nodelay` set) TCP_NODELAY on the front's
    end of it, then time `requests` requests one after another."""
    for _ in range(WARM):
        await send()
    found = None
    if reused:
        ends = ends_towards(_port(front.url))
        found = nodelay(front.pid, ends)
        if arm.nodelay:
            set_nodelay(front.pid, ends)
            if nodelay(front.pid, ends) != [1] * len(ends) or not ends:
                raise RuntimeError(f"{arm.name}: TCP_NODELAY not set on the front's end of {ends}")
    firsts, totals = [], []
    acks = delayed_acks()
    for _ in range(requests):
        first, total = await send()
        firsts.append(first)
        totals.append(total)
    return firsts, totals, found, (delayed_acks() - acks) / requests


async def _with_aiohttp(arm: Arm, front: Front, requests: int) -> tuple[Any, ...]:
    connector = (
        aiohttp.TCPConnector(limit=1, keepalive_timeout=30)
        if arm.reuse
        else aiohttp.TCPConnector(limit=1, force_close=True)
    )
    payload = body(arm.stream)
    headers = {"Content-Type": "application/json", "x-luftpause-run-id": f"ttfb-{arm.name}"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def send() -> tuple[float, float]:
            return await one(session, front.url, payload, headers)

        return await _timed(arm, front, requests, send, arm.reuse)


async def _with_openai(arm: Arm, front: Front, requests: int) -> tuple[Any, ...]:
    base = front.url.removesuffix("/chat/completions")
    async with AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as client:

        async def send() -> tuple[float, float]:
            t0 = time.perf_counter()
            first = 0.0
            stream = await client.chat.completions.create(
                model=SIM_MODEL,
                messages=[{"role": "user", "content": "ping " * 20}],
                max_tokens=16,
                stream=True,
                extra_headers={"x-luftpause-run-id": f"ttfb-{arm.name}"},
            )
            async for _ in stream:
                if not first:
                    first = time.perf_counter() - t0
            return first, time.perf_counter() - t0

        return await _timed(arm, front, requests, send, True)


async def measure(arm: Arm, front: Front, requests: int) -> dict[str, Any]:
    """One round of one arm: percentiles of time to first byte and to the end, in ms."""
    with LoadWatch() as load:
        if arm.client == "openai":
            firsts, totals, found, acks = await _with_openai(arm, front, requests)
        else:
            firsts, totals, found, acks = await _with_aiohttp(arm, front, requests)
    return {
        "ttfb": percentiles(firsts),
        "total": percentiles(totals),
        "server_nodelay": found,
        "delayed_acks_per_request": round(acks, 3),
        "load": load.summary(),
    }


def summarize_arms(per_arm: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each arm's median over rounds (with min..max) of its per-round p50 and p90, and what it
    adds over its direct arm, round by round."""
    out: dict[str, dict[str, Any]] = {}
    for name, rounds in per_arm.items():
        base = per_arm.get(BY_NAME[name].baseline)
        summary: dict[str, Any] = {
            "ttfb_p50_ms": summarize(rounds, "ttfb", "p50"),
            "ttfb_p90_ms": summarize(rounds, "ttfb", "p90"),
            "total_p50_ms": summarize(rounds, "total", "p50"),
            "server_nodelay": sorted(
                {v for r in rounds for v in (r["server_nodelay"] or ())}, reverse=True
            ),
            "delayed_acks_per_request": summarize(
                [{"acks": {"n": r["delayed_acks_per_request"]}} for r in rounds], "acks", "n"
            ),
            "cpu_busy_share_median": _median(r["load"]["cpu_busy_share"] for r in rounds),
        }
        if base is not None and name != BY_NAME[name].baseline:
            added = [
                {"added": {"p50": r["ttfb"]["p50"] - b["ttfb"]["p50"]}}
                for r, b in zip(rounds, base, strict=True)
            ]
            summary["added_ttfb_p50_ms"] = summarize(added, "added", "p50")
        out[name] = summary
    return out


def _median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def _cell(spread: dict[str, float] | None) -> str:
    if spread is None:
        return "-"
    return f"{spread['median']:.2f} ({spread['min']:.2f}..{spread['max']:.2f})"


def table(summary: dict[str, dict[str, Any]]) -> str:
    head = (
        "| arm | TTFB p50 ms | TTFB p90 ms | added TTFB p50 ms | total p50 ms "
        "| server TCP_NODELAY | delayed ACKs per request |\n|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {name} | {_cell(s['ttfb_p50_ms'])} | {_cell(s['ttfb_p90_ms'])} "
        f"| {_cell(s.get('added_ttfb_p50_ms'))} | {_cell(s['total_p50_ms'])} "
        f"| {'/'.join(map(str, s['server_nodelay'])) or '-'} "
        f"| {_cell(s['delayed_acks_per_request'])} |"
        for name, s in summary.items()
    ]
    return head + "\n".join(rows)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    arms = with_baselines(args.arms)
    extra = shlex.split(args.router_flags)
    async with AsyncExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="bench-router-ttfb-"))
        local = await LocalStack(workdir, engine_args=INSTANT, engines=1).start(stack)
        await local.wait_healthy()
        engine = local.engine_url(0)
        fronts = {
            "engine": Front(engine + "/v1/chat/completions", local.procs["engine-0"].pid),
            "luftpause": Front(local.base_url + "/chat/completions", local.procs["dataplane"].pid),
        }
        for policy in ROUTER_POLICIES:
            if any(a.front == f"router-{policy}" for a in arms):
                fronts[f"router-{policy}"] = await start_router(
                    stack, workdir, policy, engine, extra
                )
        per_arm: dict[str, list[dict[str, Any]]] = {a.name: [] for a in arms}
        for r in range(args.rounds):
            for name in rotated([a.name for a in arms], r):
                arm = BY_NAME[name]
                per_arm[name].append(await measure(arm, fronts[arm.front], args.requests))
            print(f"round {r + 1}/{args.rounds}", flush=True)
        summary = summarize_arms(per_arm)
        return {
            "routers": {k: list(f.command) for k, f in fronts.items() if f.command},
            "engine_args": list(INSTANT),
            "arms": {a.name: {"front": a.front, **_traits(a)} for a in arms},
            "summary": summary,
            "rounds": per_arm,
            "table": table(summary),
        }


def _traits(arm: Arm) -> dict[str, Any]:
    return {
        "stream": arm.stream,
        "reuse": arm.reuse,
        "nodelay": arm.nodelay,
        "client": arm.client,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=100, help="timed requests per arm per round")
    p.add_argument("--arms", nargs="+", default=[a.name for a in ARMS], choices=list(BY_NAME))
    p.add_argument(
        "--router-flags", default="", help='more sglang-router flags, e.g. "--disable-retries"'
    )
    p.add_argument("--out", default="router_ttfb", help="result name under bench/results/")
    args = p.parse_args()
    result = uvloop.run(run(args))
    print(result["table"])
    path = write_result(
        args.out,
        {
            "benchmark": "router_ttfb",
            "rounds_run": args.rounds,
            "requests_per_round": args.requests,
            "router_flags": args.router_flags,
            **result,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
