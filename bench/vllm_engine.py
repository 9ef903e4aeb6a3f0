"""What vLLM's CPU build does with Gemma 3 270M on this machine: it starts, batches, reuses a
cached prefix, and its replies carry tool calls the agents can use.

Run: `.venv/bin/python -m bench.vllm_engine [--repeats 3] [--runs 16]` after `make vllm`
(about 8 minutes on 2 cores). One replica (bench/vllm_pool.py, one core, a 1 GiB KV pool)
serves every part in turn; writes bench/results/vllm_engine.json.

- ready: seconds from starting the replica until `/health` answers (one start).
- batching: decode tokens per second of 1 request against `--batch` requests at once (each
  128 tokens, end of sequence ignored), the two arms alternating their order each repeat
  (`common.rotated`), the machine's load per arm and repeat under "load"; the ratio is the
  batch's rate over one request's.
- prefix cache: a prompt of about 1,270 tokens (a new one each repeat) sent twice, one output
  token each: seconds cold and warm, and the prompt tokens `usage` reports cached.
- tool calls: `--runs` runs per tool style through `loadgen.turn` (streamed, as the matrix's
  agents send them: `bench.flood.REAL_WORKLOAD`'s preamble, stop and temperature, a 3,000-character
  task, tools offered on each of up to 2 turns). Each offered turn is a `call` (a call the agent
  can use: OpenAI `tool_calls` with JSON arguments parsed by vLLM's hermes parser, or a
  `<tool_call>` block whose JSON parses), `unparsable` (a call was begun, none came out whole),
  `answer` (no call) or `error`. A run stops at its first turn without a call.

The machine's load average is recorded before and after: the figures are only as quiet as the
machine was.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from bench.common import LoadWatch, rotated, write_result
from bench.flood import REAL_WORKLOAD
from bench.vllm_pool import KV_GIB, MODEL, start_vllm_engines
from luftpause.testkit.loadgen import Run, Workload, answers, turn
from luftpause.testkit.preambles import FILLER, opening, pad

DECODE_TOKENS = 128
PREFIX_CHARS = 5_600  # about 1,270 Gemma tokens of filler text
TOOL_CONTEXT_CHARS = 3_000
TOOL_TURNS = 2


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


async def _decode(client: AsyncOpenAI, concurrent: int, tag: str) -> float:
    """Tokens per second over `concurrent` requests of DECODE_TOKENS tokens each."""

    async def one(i: int) -> int:
        reply = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Story {tag}-{i}: tell me about a river."}],
            max_tokens=DECODE_TOKENS,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )
        assert reply.usage is not None
        return reply.usage.completion_tokens

    t0 = time.monotonic()
    tokens = await asyncio.gather(*(one(i) for i in range(concurrent)))
    return sum(tokens) / (time.monotonic() - t0)


async def batching(client: AsyncOpenAI, repeats: int, batch: int) -> dict[str, Any]:
    arms: dict[str, list[float]] = {"one": [], "batch": []}
    loads: dict[str, list[dict[str, Any]]] = {"one": [], "batch": []}
    ratios = []
    for rep in range(repeats):
        rates = {}
        for arm in rotated(list(arms), rep):
            with LoadWatch() as load:
                rates[arm] = await _decode(client, 1 if arm == "one" else batch, f"{rep}{arm}")
            arms[arm].append(rates[arm])
            loads[arm].append(load.summary())
        ratios.append(rates["batch"] / rates["one"])
        print(f"batching repeat {rep + 1}: {rates['one']:.1f} vs {rates['batch']:.1f} tok/s")
    return {
        "batch": batch,
        "decode_tokens": DECODE_TOKENS,
        "one_tokens_per_s": _spread(arms["one"]),
        "batch_tokens_per_s": _spread(arms["batch"]),
        "ratio": _spread(ratios),
        "load": loads,
    }


async def _prompt_once(client: AsyncOpenAI, text: str) -> tuple[float, int, int]:
    t0 = time.monotonic()
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=1
    )
    seconds = time.monotonic() - t0
    usage = reply.usage
    assert usage is not None
    details = usage.prompt_tokens_details
    return seconds, usage.prompt_tokens, (details.cached_tokens or 0) if details else 0


async def prefix_cache(client: AsyncOpenAI, repeats: int) -> dict[str, Any]:
    cold, warm, cached, prompt = [], [], [], []
    for rep in range(repeats):
        text = f"Notes {rep} {time.time_ns()}: " + FILLER * (PREFIX_CHARS // len(FILLER))
        c_s, tokens, c_cached = await _prompt_once(client, text)
        w_s, _, w_cached = await _prompt_once(client, text)
        cold.append(c_s)
        warm.append(w_s)
        cached.append(w_cached)
        prompt.append(tokens)
        print(
            f"prefix repeat {rep + 1}: {tokens} tokens, {c_s:.2f} s cold ({c_cached} cached), "
            f"{w_s:.2f} s warm ({w_cached} cached)"
        )
    return {
        "prompt_tokens": _spread([float(p) for p in prompt]),
        "cold_s": _spread(cold),
        "warm_s": _spread(warm),
        "warm_cached_tokens": _spread([float(c) for c in cached]),
    }


def _outcome(run: Run, result: tuple[dict[str, Any], int] | None, dropped_before: int) -> str:
    if result is None:
        return "error"
    message, calls = result
    if calls:
        return "call"
    begun = "<tool_call>" in (message.get("content") or "")
    return "unparsable" if begun or run.dropped_calls > dropped_before else "answer"


async def _tool_run(client: AsyncOpenAI, wl: Workload, index: int) -> list[str]:
    """The outcome of each offered turn of one run."""
    rng = random.Random(f"{wl.tool_style}:{index}")
    run = Run(
        run_id=f"{wl.tool_style}-{index}",
        service_class="batch",
        caller="c",
        started=time.monotonic(),
    )
    messages: list[Any] = [
        *opening(wl.preamble, shared_chars=0, text_tools=wl.tool_style == "text"),
        {"role": "user", "content": pad(rng, wl.context_chars)},
    ]
    outcomes: list[str] = []
    for spent in range(1, TOOL_TURNS + 1):
        dropped_before = run.dropped_calls
        result = await turn(client, run, wl, messages, offer_tools=True)
        outcomes.append(_outcome(run, result, dropped_before))
        if outcomes[-1] != "call" or result is None:
            break
        message, calls = result
        messages += [message, *answers(wl, message, calls, spent)]
    return outcomes


async def tool_calls(url: str, style: str, runs: int, concurrency: int) -> dict[str, Any]:
    workload = REAL_WORKLOAD[style]
    wl = Workload(
        base_url=url + "/v1",
        model=MODEL,
        interactive=0,
        batch=runs,
        context_chars=TOOL_CONTEXT_CHARS,
        tool_calls=TOOL_TURNS,
        tool_seconds=0.0,
        window_s=0.0,
        seed=0,
        callers=1,
        max_tokens=40,
        keep_tools=style == "openai",
        tool_style=style,
        **workload,
    )
    gate = asyncio.Semaphore(concurrency)
    async with AsyncOpenAI(base_url=wl.base_url, api_key="x", max_retries=0, timeout=600) as c:

        async def gated(i: int) -> list[str]:
            async with gate:
                return await _tool_run(c, wl, i)

        per_run = await asyncio.gather(*(gated(i) for i in range(runs)))
    turns = [o for outcomes in per_run for o in outcomes]
    first = [outcomes[0] for outcomes in per_run]
    counts = {k: turns.count(k) for k in ("call", "unparsable", "answer", "error")}
    summary = {
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in workload.items()},
        "runs": runs,
        "offered_turns": len(turns),
        "outcomes": counts,
        "call_rate": round(counts["call"] / len(turns), 3),
        "first_turn_call_rate": round(first.count("call") / len(first), 3),
    }
    print(f"tool calls, {style}: {summary['outcomes']}, rate {summary['call_rate']}")
    return summary


async def measure(a: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    async with AsyncExitStack() as exits:
        workdir = Path(tempfile.mkdtemp(prefix="luftpause-vllm-bench-"))
        t0 = time.monotonic()
        [url] = await start_vllm_engines(exits, workdir, 1, kv_gib=a.kv_gib)
        ready_s = time.monotonic() - t0
        print(f"ready after {ready_s:.1f} s")
        async with AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
            batched = await batching(client, a.repeats, a.batch)
            prefix = await prefix_cache(client, a.repeats)
        tools = {
            style: await tool_calls(url, style, a.runs, a.concurrency)
            for style in ("openai", "text")
        }
    return {
        "model": MODEL,
        "kv_gib": a.kv_gib,
        "repeats": a.repeats,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "ready_s": round(ready_s, 1),
        "batching": batched,
        "prefix_cache": prefix,
        "tool_calls": tools,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.vllm_engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repeats", type=int, default=3, help="repeats of batching and prefix")
    p.add_argument("--batch", type=int, default=8, help="requests at once in the batching arm")
    p.add_argument("--runs", type=int, default=16, help="agent runs per tool style")
    p.add_argument("--concurrency", type=int, default=8, help="agent runs at once")
    p.add_argument("--kv-gib", type=float, default=KV_GIB, help="the replica's KV pool")
    p.add_argument("--out", default="vllm_engine", help="result name in bench/results/")
    a = p.parse_args(argv)
    result = asyncio.run(measure(a))
    print(write_result(a.out, result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
