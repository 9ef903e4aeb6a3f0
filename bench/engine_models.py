"""Engine models of the simulator's family: named ones and random ones.

Bench module, values only. An `EngineModel` is a full set of the simulator's engine flags: how it
admits (`reserve`, `sglang`, `ondemand` with a reply reserve), how its prefix cache keys prompts
(blocks of 1 to 64 tokens, whole messages, none) and evicts, how it computes prompts (whole,
mixed or separate chunks), its KV pool, batch cap and step costs, whether it orders its queue by
`priority`, and which metric names and `/server_info` it serves. `flags()` gives the command
line of `luftpause fake-engine`, `lab()` the same engine for bench.pool_lab.

`sample(rng)` draws one from ranges that cover the engines people run on small and large GPUs:

- SGLang: `sglang` admission, or `ondemand` reserving min(max_tokens, 256..4096); a radix
  tree cut at messages or pages of 1..64 tokens; separate or mixed chunks of 2k..16k; 16..256
  running; SGLang's metric names and /server_info;
- vLLM: `ondemand` admission reserving 0..30 % of the reply; blocks of 16; mixed chunks of
  512..16k; 16..256 running; vLLM's names;
- llama.cpp: `reserve` admission (a slot holds its prompt and reply); blocks of 1..64; mixed
  chunks of 512..2k; 2..16 slots; request counts only (a server of one slot runs one request
  at a time: there every policy is a queue, and an interactive-first one a strict priority that
  gives the interactive agents what they ask for and batch the rest, docs/measurements.md);

and across all: KV pools of 16k..400k tokens (against the benchmark's working set of about
140k), prefill at 4k..50k tokens/s, decode steps of 6..40 ms plus 0.05..1 ms per sequence, LRU
(or now and then FIFO) eviction, and a priority queue on half of the SGLang and vLLM engines
(SGLang's preempts, vLLM's does not).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, replace
from typing import Any

from bench.pool_lab import LabEngine
from luftpause.testkit.engine.params import EngineParams


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineModel:
    name: str
    family: str
    params: EngineParams
    metrics: str = "both"
    server_info: bool = True

    @property
    def priority(self) -> bool:
        """The engine orders its waiting queue by the request's `priority`."""
        return self.params.priority_order != "off"

    def flags(self) -> list[str]:
        """`luftpause fake-engine` flags for this engine (besides --port, --id, --model)."""
        p = self.params
        out = [
            f"--admission={p.admission}",
            f"--reply-reserve={p.reply_reserve}",
            f"--prefix-cache={p.prefix_cache}",
            f"--block-size={p.block_size}",
            f"--eviction={p.eviction}",
            f"--chunked-prefill={p.chunked_prefill}",
            f"--chunk-tokens={p.chunk_tokens}",
            f"--max-prefill-tokens={p.max_prefill_tokens}",
            f"--kv-tokens={p.kv_tokens}",
            f"--max-running={p.max_running}",
            f"--prefill-ms-per-token={p.prefill_ms_per_token}",
            f"--decode-base-ms={p.decode_base_ms}",
            f"--decode-ms-per-seq={p.decode_ms_per_seq}",
            f"--priority-scheduling={p.priority_order}",
            f"--metrics={self.metrics}",
        ]
        if not self.server_info:
            out.append("--no-server-info")
        if p.reserve_cap is not None:
            out.append(f"--reserve-cap={p.reserve_cap}")
        if p.preempt_threshold is not None:
            out.append(f"--priority-preemption-threshold={p.preempt_threshold}")
        return out

    def lab(self) -> LabEngine:
        return LabEngine(params=self.params, metrics=self.metrics, server_info=self.server_info)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "metrics": self.metrics,
            "server_info": self.server_info,
            **asdict(self.params),
        }


# The engine model of issue 26, written outside this project: SGLang-like, FCFS with
# head-of-line blocking on the head's uncached prompt plus min(max_tokens, 256), a radix tree
# cut at messages, separate chunks of 4,096 tokens at 8,000 tokens/s, 12 ms + 0.25 ms a
# sequence per decode step, 96k tokens of KV, 48 running, SGLang's names, no priority.
ISSUE_SGLANG = EngineModel(
    name="issue-sglang",
    family="sglang",
    params=EngineParams(
        admission="ondemand",
        reserve_cap=256,
        prefix_cache="message",
        block_size=1,
        chunked_prefill="separate",
        chunk_tokens=4096,
        prefill_ms_per_token=0.125,
        decode_base_ms=12.0,
        decode_ms_per_seq=0.25,
        kv_tokens=96_000,
        max_running=48,
    ),
    metrics="sglang",
)


def _issue_variant(suffix: str, **params: Any) -> EngineModel:
    """The issue's model with some of its parameters changed."""
    return replace(
        ISSUE_SGLANG, name=f"issue-sglang-{suffix}", params=replace(ISSUE_SGLANG.params, **params)
    )


NAMED: dict[str, EngineModel] = {
    m.name: m
    for m in (
        ISSUE_SGLANG,
        _issue_variant("kv48k", kv_tokens=48_000),
        _issue_variant("run8", max_running=8),
        _issue_variant("optimistic", reply_reserve=0.25),
        _issue_variant("blocks16", prefix_cache="block", block_size=16),
    )
}


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _round(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}")


def sample(rng: random.Random, name: str) -> EngineModel:
    """One engine model drawn from the ranges in the module docstring."""
    family = rng.choices(("sglang", "vllm", "llamacpp"), weights=(0.4, 0.4, 0.2))[0]
    kv = int(_log_uniform(rng, 16_000, 400_000)) // 64 * 64
    prefill = _round(_log_uniform(rng, 0.02, 0.25))
    base = _round(rng.uniform(6.0, 40.0))
    per_seq = _round(_log_uniform(rng, 0.05, 1.0))
    eviction = "fifo" if rng.random() < 0.15 else "lru"
    priority = family != "llamacpp" and rng.random() < 0.5
    common: dict[str, Any] = dict(
        kv_tokens=kv,
        prefill_ms_per_token=prefill,
        decode_base_ms=base,
        decode_ms_per_seq=per_seq,
        eviction=eviction,
        priority_order="low-first" if priority else "off",
    )
    if family == "sglang":
        message = rng.random() < 0.5
        params = EngineParams(
            **common,
            admission=rng.choice(("sglang", "ondemand")),
            reserve_cap=rng.choice((256, 1024, 4096)),
            prefix_cache="message" if message else "block",
            block_size=1 if message else rng.choice((1, 16, 64)),
            chunked_prefill=rng.choice(("separate", "mixed")),
            chunk_tokens=rng.choice((2048, 4096, 8192, 16384)),
            max_running=rng.choice((16, 32, 48, 64, 128, 256)),
            preempt_threshold=10 if priority else None,
        )
        return EngineModel(name=name, family=family, params=params, metrics="sglang")
    if family == "vllm":
        params = EngineParams(
            **common,
            admission="ondemand",
            reply_reserve=_round(rng.uniform(0.0, 0.3), 2),
            block_size=16,
            chunked_prefill="mixed",
            chunk_tokens=rng.choice((512, 2048, 8192, 16384)),
            max_running=rng.choice((16, 32, 64, 128, 256)),
        )
        return EngineModel(
            name=name, family=family, params=params, metrics="vllm", server_info=False
        )
    slots = rng.choice((2, 4, 8, 16))
    params = EngineParams(
        **common,
        admission="reserve",
        block_size=rng.choice((1, 16, 64)),
        chunked_prefill="mixed",
        chunk_tokens=rng.choice((512, 2048)),
        max_running=slots,
    )
    return EngineModel(
        name=name, family=family, params=params, metrics="llamacpp", server_info=False
    )


def sampled(seed: int, n: int) -> list[EngineModel]:
    """`n` engine models drawn with `seed`, named family-seed-index."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        m = sample(rng, "")
        out.append(replace(m, name=f"{m.family}-{seed}-{i}"))
    return out
