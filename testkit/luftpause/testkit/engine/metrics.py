"""Prometheus text for `/metrics`, under SGLang's and vLLM's metric names, one of them, or only
llama.cpp's request counts (`SimParams.metrics`).

Pure module: renders an `EngineStats` snapshot plus the shell's own counters (always).
Usage gauges count blocks held by running requests; cached but unreferenced blocks count as
free, as both engines report them. Token amounts are whole blocks times the block size.
"""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.testkit.engine.records import EngineStats


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellCounters:
    requests_total: int
    rate_limited_total: int
    rejected_total: int
    steps_total: int
    busy_ms_total: float
    lag_seconds: float
    # The rate limiter's tally (zero where a caller has no limiter).
    served_total: int = 0
    billed_tokens_total: int = 0
    refused_tokens_total: int = 0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _shown(name: str, names: str) -> bool:
    """Whether the engine kind `names` exports metric `name`."""
    family = name.split(":", 1)[0] if ":" in name else "luftpause"
    return family == "luftpause" or names in (family, "both" if family != "llamacpp" else "")


def render(
    stats: EngineStats, shell: ShellCounters, *, model: str, replica: str, names: str = "both"
) -> str:
    """The exposition text; every sample is `name{labels} value` on its own line."""
    base = f'model_name="{_escape(model)}",engine="{_escape(replica)}"'
    bs = stats.block_size
    rows: list[tuple[str, str, str, float]] = [
        ("sglang:num_running_reqs", "gauge", "Running requests", stats.running),
        ("sglang:num_queue_reqs", "gauge", "Requests in the waiting queue", stats.waiting),
        ("sglang:cache_hit_rate", "gauge", "Prefix cache hit rate (tokens)", stats.cache_hit_rate),
        ("sglang:token_usage", "gauge", "Fraction of the KV pool in use", stats.token_usage),
        (
            "sglang:max_total_num_tokens",
            "gauge",
            "KV pool size in tokens",
            stats.total_blocks * bs,
        ),
        (
            "sglang:num_used_tokens",
            "gauge",
            "KV tokens held by running requests",
            stats.used_blocks * bs,
        ),
        (
            "sglang:kv_available_tokens",
            "gauge",
            "KV tokens free",
            stats.free_blocks * bs,
        ),
        (
            "sglang:kv_evictable_tokens",
            "gauge",
            "KV tokens cached and unreferenced (evictable)",
            stats.evictable_blocks * bs,
        ),
        (
            "sglang:kv_used_tokens",
            "gauge",
            "KV tokens held by running requests",
            stats.used_blocks * bs,
        ),
        (
            "sglang:new_token_ratio",
            "gauge",
            "Share of a running request's remaining reply that admission reserves",
            stats.new_token_ratio,
        ),
        (
            "sglang:num_retracted_requests_total",
            "counter",
            "Running requests retracted because a decode step ran out of KV blocks",
            stats.retracted_total,
        ),
        ("llamacpp:requests_processing", "gauge", "Requests processing", stats.running),
        ("llamacpp:requests_deferred", "gauge", "Requests deferred", stats.waiting),
        ("vllm:num_requests_running", "gauge", "Running requests", stats.running),
        ("vllm:num_requests_waiting", "gauge", "Waiting requests", stats.waiting),
        ("vllm:gpu_cache_usage_perc", "gauge", "KV cache usage, 1 = full", stats.token_usage),
        ("vllm:kv_cache_usage_perc", "gauge", "KV cache usage, 1 = full", stats.token_usage),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache",
            stats.prompt_tokens_total,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache",
            stats.cached_tokens_total,
        ),
        ("vllm:prompt_tokens_total", "counter", "Prompt tokens", stats.prompt_tokens_total),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Generated tokens",
            stats.generation_tokens_total,
        ),
        (
            "luftpause_sim_requests_total",
            "counter",
            "Chat and classify requests received",
            shell.requests_total,
        ),
        ("luftpause_sim_aborted_total", "counter", "Requests aborted", stats.aborted_total),
        (
            "vllm:num_preemptions_total",
            "counter",
            "Running requests preempted for a waiting one of better priority",
            stats.preempted_total,
        ),
        (
            "luftpause_sim_finished_total",
            "counter",
            "Requests that ran to the end",
            stats.finished_total,
        ),
        (
            "luftpause_sim_prompt_tokens_total",
            "counter",
            "Prompt tokens admitted",
            stats.prompt_tokens_total,
        ),
        (
            "luftpause_sim_cached_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache",
            stats.cached_tokens_total,
        ),
        (
            "luftpause_sim_rate_limited_total",
            "counter",
            "Requests answered 429",
            shell.rate_limited_total,
        ),
        (
            "luftpause_sim_ratelimit_served_total",
            "counter",
            "Requests the rate limiter let through",
            shell.served_total,
        ),
        (
            "luftpause_sim_ratelimit_refused_total",
            "counter",
            "Requests the rate limiter refused (429)",
            shell.rate_limited_total,
        ),
        (
            "luftpause_sim_billed_tokens_total",
            "counter",
            "Prompt and generated tokens of served requests, counted when each reply ends",
            shell.billed_tokens_total,
        ),
        (
            "luftpause_sim_refused_tokens_total",
            "counter",
            "Tokens the refused requests would have been charged",
            shell.refused_tokens_total,
        ),
        (
            "luftpause_sim_rejected_total",
            "counter",
            "Requests answered 4xx other than 429",
            shell.rejected_total,
        ),
        ("luftpause_sim_steps_total", "counter", "Engine iterations run", shell.steps_total),
        (
            "luftpause_sim_busy_ms_total",
            "counter",
            "Simulated milliseconds spent in engine iterations",
            shell.busy_ms_total,
        ),
        (
            "luftpause_sim_lag_seconds",
            "gauge",
            "Real seconds the engine loop ran behind its simulated schedule at its last step",
            shell.lag_seconds,
        ),
        ("luftpause_sim_kv_blocks", "gauge", "Blocks in the KV pool", stats.total_blocks),
        (
            "luftpause_sim_kv_blocks_cached",
            "gauge",
            "Blocks in the prefix cache",
            stats.cached_blocks,
        ),
    ]
    lines: list[str] = []
    for name, kind, help_text, value in rows:
        if not _shown(name, names):
            continue
        family = name.removesuffix("_total") if kind == "counter" else name
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} {kind}"]
        shown = str(value) if isinstance(value, int) else f"{value:.6g}"
        lines.append(f"{name}{{{base}}} {shown}")
    # vLLM's info gauge: the value is 1, the configuration is in the labels.
    info = (
        f'{base},num_gpu_blocks="{stats.total_blocks}",block_size="{bs}",'
        f'kv_cache_size_tokens="{stats.total_blocks * bs}"'
    )
    if not _shown("vllm:cache_config_info", names):
        return "\n".join(lines) + "\n"
    lines += [
        "# HELP vllm:cache_config_info Information of the KV cache configuration",
        "# TYPE vllm:cache_config_info gauge",
        f"vllm:cache_config_info{{{info}}} 1",
    ]
    return "\n".join(lines) + "\n"
