"""What an engine's `/metrics` says about its load: requests running and waiting, and its KV pool.

Pure module: Prometheus text in, values out; no I/O. Names understood, first match wins:

  requests   SGLang     sglang:num_running_reqs      sglang:num_queue_reqs
             vLLM       vllm:num_requests_running    vllm:num_requests_waiting
             llama.cpp  llamacpp:requests_processing llamacpp:requests_deferred
  KV pool    SGLang     sglang:max_total_num_tokens, and sglang:num_used_tokens (else
                        sglang:token_usage times the pool)
             vLLM       vllm:cache_config_info's labels kv_cache_size_tokens (else
                        num_gpu_blocks times block_size), and vllm:kv_cache_usage_perc
                        (else the older vllm:gpu_cache_usage_perc) times the pool

Both engines count a block that only the prefix cache holds as free, so `kv_used` is the KV held
by requests in the batch. llama.cpp exports no KV figures: its capacity is its slots.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

LOAD_NAMES: tuple[tuple[str, str], ...] = (
    ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
)
_VLLM_CONFIG = "vllm:cache_config_info"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    running: int
    waiting: int
    # The engine's KV pool in tokens and the tokens its running requests hold; None when the
    # engine does not say.
    kv_total: int | None = None
    kv_used: int | None = None


def _samples(text: str) -> tuple[dict[str, float], list[str]]:
    """Sum of every sample per metric name (over label sets), and vLLM's cache config lines."""
    sums: dict[str, float] = {}
    config: list[str] = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end <= 0:
            continue
        name = line[:name_end]
        if name == _VLLM_CONFIG:
            config.append(line)
        rest = line[line.rfind("}") + 1 :] if line[name_end] == "{" else line[name_end:]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            sums[name] = sums.get(name, 0.0) + value
    return sums, config


def _positive(value: str | float | None) -> int | None:
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number >= 1 else None


def _vllm_pool(config: list[str]) -> int | None:
    """vLLM's KV pool in tokens from its cache_config_info labels (summed over engines)."""
    total = 0
    for line in config:
        labels = dict(_LABEL.findall(line[line.find("{") : line.rfind("}") + 1]))
        tokens = _positive(labels.get("kv_cache_size_tokens"))
        if tokens is None:
            blocks = _positive(labels.get("num_gpu_blocks"))
            size = _positive(labels.get("block_size"))
            tokens = blocks * size if blocks and size else None
        if tokens is None:
            return None
        total += tokens
    return total or None


def _kv(sums: dict[str, float], config: list[str]) -> tuple[int | None, int | None]:
    pool = _positive(sums.get("sglang:max_total_num_tokens"))
    if pool is not None:
        if "sglang:num_used_tokens" in sums:
            return pool, max(int(sums["sglang:num_used_tokens"]), 0)
        usage = sums.get("sglang:token_usage")
        return pool, None if usage is None else round(min(max(usage, 0.0), 1.0) * pool)
    pool = _vllm_pool(config)
    if pool is None:
        return None, None
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        if name in sums:
            return pool, round(min(max(sums[name], 0.0), 1.0) * pool)
    return pool, None


def parse_load(text: str) -> Load | None:
    """Running and waiting requests (and the KV pool, if known), or None if no known names."""
    sums, config = _samples(text)
    for running, waiting in LOAD_NAMES:
        if running in sums and waiting in sums:
            kv_total, kv_used = _kv(sums, config)
            return Load(
                running=int(sums[running]),
                waiting=int(sums[waiting]),
                kv_total=kv_total,
                kv_used=kv_used,
            )
    return None


def sum_loads(loads: Iterable[Load | None]) -> Load | None:
    """The summed load of the targets that gave one; None when none did.

    The KV pool is summed only when every target that gave a load reported one: a partial sum
    would understate the pool.
    """
    known = [load for load in loads if load is not None]
    if not known:
        return None
    kv_known = all(load.kv_total is not None for load in known)
    used_known = kv_known and all(load.kv_used is not None for load in known)
    return Load(
        running=sum(load.running for load in known),
        waiting=sum(load.waiting for load in known),
        kv_total=sum(load.kv_total or 0 for load in known) if kv_known else None,
        kv_used=sum(load.kv_used or 0 for load in known) if used_known else None,
    )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def engine_max_running(info: object) -> int | None:
    """The most requests an engine runs at once, from SGLang's `/server_info` body: its top-level
    `max_running_requests` when set, else the first data-parallel rank's effective one."""
    if not isinstance(info, dict):
        return None
    top = _count(info.get("max_running_requests"))
    if top is not None:
        return top
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        first = states[0]
        return _count(first.get("effective_max_running_requests_per_dp")) or _count(
            first.get("max_running_requests")
        )
    return None
