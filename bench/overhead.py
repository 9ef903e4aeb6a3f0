"""What the dataplane adds per turn: time to first byte and to completion, CPU, requests/s.

Run: `.venv/bin/python -m bench.overhead [--rounds 5] [--requests 256]`.
One simulated engine set to reply instantly (no prefill or decode time, 16-token streams), a
scheduler, a dataplane, a bare aiohttp pass-through (`bench.passthrough`: the floor for any
Python hop on this machine), and the peers (sglang-router, the LiteLLM proxy) in front of the
same engine. Arms take turns in an order rotated round by round (`common.rotated`), so drift on
this noisy 2-core machine hits all alike; each arm's figure is the median over rounds of the
per-round figure, with the spread (min..max over rounds) beside it, and the machine's load while
the arm ran, per round (`common.LoadWatch`, under "load"). Clients keep their connections alive,
as the OpenAI SDK does, and every connection is warmed before a measured phase starts.

Three dataplane arms share the scheduler: `dataplane` as deployed (the engine is open, so it
places turns itself and reports them), `dataplane-ask` (`--no-local-placement`: every turn
waits for the scheduler's placement, as when engines queue) and `dataplane-2workers`
(`--workers 2`: two dataplane processes on one port; its CPU counts both workers and their
supervisor). `dataplane-traced` is a scheduler and dataplane pair of their own, started with
`OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a local OTLP/gRPC endpoint that accepts and discards
(`bench.otlp_sink`, its CPU not counted): beside `dataplane` (tracing off) it shows what tracing
adds per turn, every turn traced (a span in the dataplane, one in the scheduler, exported in
batches).

With `--pin` the arm under test gets a core to itself, as a proxy deployed on its own machine or
pod has: the arms' processes (and all their threads and children) run on the last CPU, the
clients (this process) and the engine on the others. Without it every process shares every core,
and at 32 streams what an arm adds is mostly the CPU it takes from the clients and the engine.
Results go to bench/results/overhead_pinned.json unless `--out` says otherwise.

`--apis` measures the Messages and Responses doors instead, translated and passed through
(`bench.overhead_apis`, bench/results/overhead_apis.json).

Per phase and arm: latency to first byte and to completion (p50/p99, and what the arm adds
over going direct), requests/s, and CPU per turn: utime+stime from /proc of the arm's own
processes (the dataplane and the scheduler together; the router; the LiteLLM proxy), delta over
the measured phase divided by the turns served. Writes bench/results/overhead.json, with the
Markdown table printed at the end stored under "table".
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench.common import LoadWatch, percentiles, rotated, write_result
from bench.overhead_table import table
from bench.pinning import pin_arms
from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import SIM_MODEL, LocalStack
from luftpause.testkit.status import wait_for_status

INSTANT = (
    "--prefill-ms-per-token",
    "0",
    "--decode-base-ms",
    "0",
    "--decode-ms-per-seq",
    "0",
    "--reply-tokens",
    "16",
)


def body(stream: bool) -> bytes:
    return json.dumps(
        {
            "model": SIM_MODEL,
            "stream": stream,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "ping " * 20}],
        }
    ).encode()


async def one(
    session: aiohttp.ClientSession, url: str, payload: bytes, headers: dict[str, str]
) -> tuple[float, float]:
    t0 = time.perf_counter()
    async with session.post(url, data=payload, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {await resp.text()}")
        first = 0.0
        async for chunk in resp.content.iter_any():
            if chunk and not first:
                first = time.perf_counter() - t0
        return first, time.perf_counter() - t0


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """utime+stime of these processes (all their threads), in seconds, from /proc."""
    total = 0
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return total / CLOCK_TICKS


async def arm(
    url: str,
    concurrency: int,
    requests: int,
    stream: bool,
    pids: list[int],
    payload: bytes | None = None,
) -> dict[str, Any]:
    """One measured phase: warm every connection, then `requests` turns over `concurrency`
    (each a chat completion unless `payload` says another request)."""
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=30)
    ttfb: list[float] = []
    total: list[float] = []
    payload = body(stream) if payload is None else payload
    headers = [
        {"Content-Type": "application/json", "x-luftpause-run-id": f"bench-{w}"}
        for w in range(concurrency)
    ]
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(w: int) -> None:
            for _ in range(requests // concurrency):
                a, b = await one(session, url, payload, headers[w])
                ttfb.append(a)
                total.append(b)

        await asyncio.gather(*(one(session, url, payload, headers[w]) for w in range(concurrency)))
        cpu0 = [cpu_seconds([pid]) for pid in pids]
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - t0
        each = [(cpu_seconds([pid]) - c) * 1000.0 for pid, c in zip(pids, cpu0, strict=True)]
    out = {"ttfb": percentiles(ttfb), "total": percentiles(total), "rps": len(total) / elapsed}
    if pids:
        out["cpu_ms"] = sum(each)
        out["cpu_ms_each"] = each  # in the arm's order of processes (dataplane, scheduler)
        out["turns"] = len(total)
    return out


async def rounds(
    names: Sequence[str], count: int, measure: Callable[[str], Awaitable[dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """Each arm measured `count` times, their order rotated round by round; each round's
    figures with the machine's load while the arm ran."""
    per_arm: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(count):
        for name in rotated(names, r):
            with LoadWatch() as load:
                figures = await measure(name)
            per_arm[name].append({**figures, "load": load.summary()})
    return per_arm


def summarize(rounds: list[dict[str, Any]], key: str, stat: str) -> dict[str, float]:
    values = [r[key][stat] for r in rounds]
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


async def _peer(
    stack: AsyncExitStack,
    workdir: Path,
    name: str,
    program: list[str],
    args: list[str],
    ready: str,
    env: dict[str, str] | None = None,
) -> int:
    proc = await Proc(
        args, name=name, program=program, log_path=workdir / f"{name}.log", env=env
    ).start()
    stack.push_async_callback(proc.stop)
    await proc.wait_http(ready, timeout=120)
    return proc.pid


async def peers(
    stack: AsyncExitStack, workdir: Path, engine: str
) -> dict[str, tuple[str, list[int]]]:
    """The peers people would use instead, in front of the same engine, where installed."""
    urls: dict[str, tuple[str, list[int]]] = {}
    if importlib.util.find_spec("sglang_router") is not None:
        port = free_port()
        pid = await _peer(
            stack,
            workdir,
            "sglang-router",
            [sys.executable, "-m", "sglang_router.launch_router"],
            [
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                "round_robin",
                "--worker-urls",
                engine,
                "--log-level",
                "warn",
            ],
            f"http://127.0.0.1:{port}/v1/models",
        )
        urls["sglang-router"] = (f"http://127.0.0.1:{port}/v1/chat/completions", [pid])
    litellm = Path(sys.executable).with_name("litellm")
    if litellm.exists():
        port = free_port()
        config = workdir / "litellm.yaml"
        config.write_text(
            "model_list:\n  - model_name: " + SIM_MODEL + "\n    litellm_params:\n"
            f"      model: openai/{SIM_MODEL}\n      api_base: {engine}/v1\n"
            "      api_key: x\n"
        )
        pid = await _peer(
            stack,
            workdir,
            "litellm",
            [str(litellm)],
            ["--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            f"http://127.0.0.1:{port}/health/liveliness",
            env={
                "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
                "LITELLM_TELEMETRY": "False",
            },
        )
        urls["litellm"] = (f"http://127.0.0.1:{port}/v1/chat/completions", [pid])
    return urls


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
        local = await LocalStack(workdir, engine_args=INSTANT, engines=1).start(stack)
        await local.wait_healthy()
        scheduler = local.procs["scheduler"].pid
        own = [local.procs["dataplane"].pid, scheduler]
        arms: dict[str, tuple[str, list[int]]] = {
            "direct": (local.engine_url(0) + "/v1/chat/completions", []),
            "dataplane": (local.base_url + "/chat/completions", own),
        }
        # The same dataplane asking the scheduler for every turn: what local placement saves.
        port = free_port()
        asking = await _peer(
            stack,
            workdir,
            "dataplane-ask",
            [str(Path(sys.executable).with_name("luftpause"))],
            [
                "dataplane",
                "--port",
                str(port),
                "--scheduler",
                f"127.0.0.1:{local.grpc_port}",
                "--id",
                "dataplane-ask",
                "--no-local-placement",
            ],
            f"http://127.0.0.1:{port}/health",
        )
        arms["dataplane-ask"] = (
            f"http://127.0.0.1:{port}/v1/chat/completions",
            [asking, scheduler],
        )
        # The same dataplane as two workers on one port (`--workers 2`), each its own process.
        port = free_port()
        supervisor = await _peer(
            stack,
            workdir,
            "dataplane-2workers",
            [str(Path(sys.executable).with_name("luftpause"))],
            [
                "dataplane",
                *("--port", str(port), "--scheduler", f"127.0.0.1:{local.grpc_port}"),
                *("--id", "dataplane-2w", "--workers", "2"),
            ],
            f"http://127.0.0.1:{port}/health",
        )
        two = await _workers_of(supervisor, 2)
        arms["dataplane-2workers"] = (
            f"http://127.0.0.1:{port}/v1/chat/completions",
            [supervisor, *two, scheduler],
        )
        arms["dataplane-traced"] = await traced_pair(stack, workdir)
        port = free_port()
        floor = await _peer(
            stack,
            workdir,
            "passthrough",
            [sys.executable, "-m", "bench.passthrough"],
            ["--port", str(port), "--upstream", local.engine_url(0)],
            f"http://127.0.0.1:{port}/health",
        )
        arms["aiohttp-passthrough"] = (f"http://127.0.0.1:{port}/v1/chat/completions", [floor])
        if not args.no_peers:
            arms.update(await peers(stack, workdir, local.engine_url(0)))
        out: dict[str, Any] = {}
        if args.pin:
            out["pinned"] = pin_arms(arms, local.procs["engine-0"].pid)
            print("pinned", json.dumps(out["pinned"]), flush=True)
        for concurrency in args.concurrency:
            for stream in (True, False):

                async def measure(
                    name: str, c: int = concurrency, s: bool = stream
                ) -> dict[str, Any]:
                    url, pids = arms[name]
                    return await arm(url, c, args.requests, s, pids)

                per_arm = await rounds(list(arms), args.rounds, measure)
                label = f"c{concurrency}_{'stream' if stream else 'nonstream'}"
                out[label] = _compare(per_arm)
                print(label, json.dumps(out[label]["added_ms"]), flush=True)
        return out


async def traced_pair(stack: AsyncExitStack, workdir: Path) -> tuple[str, list[int]]:
    """A scheduler and a dataplane exporting every turn's spans to a local OTLP sink."""
    sink_port = free_port()
    sink = Proc(
        ["--port", str(sink_port)],
        name="otlp-sink",
        program=[sys.executable, "-m", "bench.otlp_sink"],
        log_path=workdir / "otlp-sink.log",
    )
    await sink.start()
    stack.push_async_callback(sink.stop)
    await sink.wait_port(sink_port)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}"}
    exe = [str(Path(sys.executable).with_name("luftpause"))]
    config = str(workdir / "endpoints.yaml")  # the LocalStack's: the same engine
    grpc_port, http_port, port = free_port(), free_port(), free_port()
    scheduler = await _peer(
        stack,
        workdir,
        "scheduler-traced",
        exe,
        [
            *("scheduler", "--config", config),
            *("--grpc-port", str(grpc_port), "--http-port", str(http_port)),
        ],
        f"http://127.0.0.1:{http_port}/health",
        env=env,
    )
    await wait_for_status(
        f"http://127.0.0.1:{http_port}/status",
        lambda st: all(r["healthy"] for r in st["replicas"]),
    )
    dataplane = await _peer(
        stack,
        workdir,
        "dataplane-traced",
        exe,
        [
            *("dataplane", "--port", str(port), "--scheduler", f"127.0.0.1:{grpc_port}"),
            *("--config", config, "--id", "dataplane-traced"),
        ],
        f"http://127.0.0.1:{port}/health",
        env=env,
    )
    return f"http://127.0.0.1:{port}/v1/chat/completions", [dataplane, scheduler]


async def _workers_of(supervisor: int, count: int) -> list[int]:
    """The pids of a `--workers` supervisor's children, once all `count` have started."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children")
    async with asyncio.timeout(30):
        while len(pids := [int(p) for p in children.read_text().split()]) < count:
            await asyncio.sleep(0.05)
    return pids


def _spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def _compare(per_arm: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    arms: dict[str, dict[str, Any]] = {}
    for name, rs in per_arm.items():
        arms[name] = {
            "ttfb_p50_ms": summarize(rs, "ttfb", "p50"),
            "ttfb_p99_ms": summarize(rs, "ttfb", "p99"),
            "total_p50_ms": summarize(rs, "total", "p50"),
            "total_p99_ms": summarize(rs, "total", "p99"),
            "rps": _spread([r["rps"] for r in rs], 1),
        }
        if "load" in rs[0]:
            arms[name]["load"] = [r["load"] for r in rs]  # per round, in the rounds' order
        if "cpu_ms" in rs[0]:
            arms[name]["cpu_ms_per_turn"] = {
                **_spread([r["cpu_ms"] / r["turns"] for r in rs]),
                "pooled": round(sum(r["cpu_ms"] for r in rs) / sum(r["turns"] for r in rs), 3),
            }
            if len(rs[0].get("cpu_ms_each", ())) > 1:
                arms[name]["cpu_ms_per_turn_each"] = [
                    _spread([r["cpu_ms_each"][i] / r["turns"] for r in rs])
                    for i in range(len(rs[0]["cpu_ms_each"]))
                ]
    direct = per_arm["direct"]
    added: dict[str, dict[str, float]] = {
        f"{name}_{stat}": _spread(
            [p[key][q] - d[key][q] for d, p in zip(direct, proxied, strict=True)]
        )
        for name, proxied in per_arm.items()
        if name != "direct"
        for stat, key, q in (
            ("ttfb_p50", "ttfb", "p50"),
            ("ttfb_p99", "ttfb", "p99"),
            ("total_p50", "total", "p50"),
            ("total_p99", "total", "p99"),
        )
    }
    return {"arms": arms, "added_ms": added}


def main() -> None:
    if "--apis" in sys.argv[1:]:  # the Messages and Responses doors (`bench.overhead_apis`)
        from bench.overhead_apis import main as apis_main

        apis_main([a for a in sys.argv[1:] if a != "--apis"])
        return
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=256, help="timed requests per arm per round")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--no-peers", action="store_true", help="skip sglang-router and LiteLLM")
    p.add_argument(
        "--pin", action="store_true", help="the arm under test on a CPU of its own (see above)"
    )
    p.add_argument("--out", default=None, help="result name under bench/results/")
    args = p.parse_args()
    if args.out is None:
        args.out = "overhead_pinned" if args.pin else "overhead"
    result = uvloop.run(run(args))
    text = table(result)
    save("overhead", args, result, text)


def save(benchmark: str, args: argparse.Namespace, result: dict[str, Any], text: str) -> None:
    """Print the table and write the results with the run's settings."""
    print(text)
    path = write_result(
        args.out,
        {
            "benchmark": benchmark,
            "rounds": args.rounds,
            "requests_per_round": args.requests,
            "results": result,
            "table": text,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
