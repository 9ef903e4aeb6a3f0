"""What the dataplane adds per turn: time to first byte and to completion, direct vs proxied.

Run: `.venv/bin/python -m bench.overhead [--rounds 5] [--requests 200]`.
One simulated engine set to reply instantly (no prefill or decode time, 16-token streams), a
scheduler, a dataplane. Arms alternate round by round against the same engine, so drift on
this noisy 2-core machine hits both alike; each arm's figure is the median over rounds of the
per-round percentile, with the spread (min..max over rounds) beside it. Clients keep their
connections alive, as the OpenAI SDK does. Writes bench/results/overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench.common import percentiles, write_result
from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import SIM_MODEL, LocalStack

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


async def arm(url: str, concurrency: int, requests: int, stream: bool) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=30)
    ttfb: list[float] = []
    total: list[float] = []
    payload = body(stream)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(w: int) -> None:
            headers = {"Content-Type": "application/json", "x-luftpause-run-id": f"bench-{w}"}
            await one(session, url, payload, headers)  # warm the connection
            for _ in range(requests // concurrency):
                a, b = await one(session, url, payload, headers)
                ttfb.append(a)
                total.append(b)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {"ttfb": percentiles(ttfb), "total": percentiles(total), "rps": len(total) / elapsed}


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
) -> None:
    proc = await Proc(
        args, name=name, program=program, log_path=workdir / f"{name}.log", env=env
    ).start()
    stack.push_async_callback(proc.stop)
    await proc.wait_http(ready, timeout=120)


async def peers(stack: AsyncExitStack, workdir: Path, engine: str) -> dict[str, str]:
    """The peers people would use instead, in front of the same engine, where installed."""
    urls: dict[str, str] = {}
    if importlib.util.find_spec("sglang_router") is not None:
        port = free_port()
        await _peer(
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
        urls["sglang-router"] = f"http://127.0.0.1:{port}/v1/chat/completions"
    litellm = Path(sys.executable).with_name("litellm")
    if litellm.exists():
        port = free_port()
        config = workdir / "litellm.yaml"
        config.write_text(
            "model_list:\n  - model_name: " + SIM_MODEL + "\n    litellm_params:\n"
            f"      model: openai/{SIM_MODEL}\n      api_base: {engine}/v1\n"
            "      api_key: x\n"
        )
        await _peer(
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
        urls["litellm"] = f"http://127.0.0.1:{port}/v1/chat/completions"
    return urls


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
        local = await LocalStack(workdir, engine_args=INSTANT, engines=1).start(stack)
        await local.wait_healthy()
        urls = {
            "direct": local.engine_url(0) + "/v1/chat/completions",
            "dataplane": local.base_url + "/chat/completions",
        }
        if not args.no_peers:
            urls.update(await peers(stack, workdir, local.engine_url(0)))
        out: dict[str, Any] = {}
        for concurrency in args.concurrency:
            for stream in (True, False):
                per_arm: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
                for _ in range(args.rounds):
                    for name, url in urls.items():
                        per_arm[name].append(await arm(url, concurrency, args.requests, stream))
                label = f"c{concurrency}_{'stream' if stream else 'nonstream'}"
                out[label] = _compare(per_arm)
                print(label, json.dumps(out[label]["added_ms"]), flush=True)
        return out


def _compare(per_arm: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    arms = {
        name: {
            "ttfb_p50_ms": summarize(rs, "ttfb", "p50"),
            "ttfb_p99_ms": summarize(rs, "ttfb", "p99"),
            "total_p50_ms": summarize(rs, "total", "p50"),
            "total_p99_ms": summarize(rs, "total", "p99"),
            "rps": round(statistics.median(r["rps"] for r in rs), 1),
        }
        for name, rs in per_arm.items()
    }
    direct = per_arm["direct"]
    added = {
        f"{name}_{stat}": round(
            statistics.median(p[key][q] - d[key][q] for d, p in zip(direct, proxied, strict=True)),
            3,
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
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=256, help="timed requests per arm per round")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--no-peers", action="store_true", help="skip sglang-router and LiteLLM")
    args = p.parse_args()
    result = uvloop.run(run(args))
    path = write_result(
        "overhead",
        {
            "benchmark": "overhead",
            "rounds": args.rounds,
            "requests_per_round": args.requests,
            "results": result,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
