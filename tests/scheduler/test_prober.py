"""Reading engine load from Prometheus text (pure, no sockets)."""

from __future__ import annotations

from pathlib import Path

from luftpause.scheduler.engine_load import Load, parse_load

# Whole /metrics pages of real engines, captured while busy (see each test).
CAPTURED = Path(__file__).parent / "captured"

SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified"} 7.0
sglang:num_queue_reqs{model_name="m",engine_type="unified"} 3.0
"""

VLLM = """vllm:num_requests_running{model_name="m"} 4
vllm:num_requests_waiting{model_name="m"} 0
vllm:num_requests_running{model_name="n"} 2
vllm:num_requests_waiting{model_name="n"} 1
"""

LLAMACPP = """llamacpp:requests_processing 2
llamacpp:requests_deferred 5
"""


def test_sglang_running_and_queued_requests_are_read() -> None:
    assert parse_load(SGLANG) == Load(running=7, waiting=3)


def test_vllm_samples_are_summed_over_models() -> None:
    assert parse_load(VLLM) == Load(running=6, waiting=1)


def test_llamacpp_processing_and_deferred_are_read() -> None:
    assert parse_load(LLAMACPP) == Load(running=2, waiting=5)


def test_sglang_names_win_over_vllm_names_when_both_are_exported() -> None:
    assert parse_load(SGLANG + VLLM) == Load(running=7, waiting=3)


def test_engine_without_known_names_reports_no_load() -> None:
    assert parse_load("process_cpu_seconds_total 12\n") is None
    assert parse_load("sglang:num_running_reqs 3\n") is None  # no queue metric: no load
    assert parse_load("") is None


def test_malformed_lines_are_skipped() -> None:
    text = (
        'garbage\nsglang:num_running_reqs{a="b"} NaN\nsglang:num_running_reqs 1\n'
        "sglang:num_queue_reqs x\nsglang:num_queue_reqs 2 1700000000\n"
    )
    assert parse_load(text) == Load(running=1, waiting=2)


SGLANG_KV = SGLANG + (
    'sglang:max_total_num_tokens{model_name="m"} 96000.0\n'
    'sglang:num_used_tokens{model_name="m"} 48000.0\n'
    'sglang:token_usage{model_name="m"} 0.25\n'
)
VLLM_KV = VLLM + (
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2000",'
    'enable_prefix_caching="True"} 1.0\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
)


def test_sglang_kv_pool_and_used_tokens_are_read() -> None:
    assert parse_load(SGLANG_KV) == Load(running=7, waiting=3, kv_total=96000, kv_used=48000)


def test_sglang_token_usage_stands_in_for_used_tokens() -> None:
    text = SGLANG + "sglang:max_total_num_tokens 1000\nsglang:token_usage 0.25\n"
    assert parse_load(text) == Load(running=7, waiting=3, kv_total=1000, kv_used=250)


def test_vllm_pool_comes_from_the_cache_config_labels() -> None:
    assert parse_load(VLLM_KV) == Load(running=6, waiting=1, kv_total=32000, kv_used=16000)
    sized = VLLM + 'vllm:cache_config_info{kv_cache_size_tokens="5000"} 1\n'
    assert parse_load(sized) == Load(running=6, waiting=1, kv_total=5000, kv_used=None)


def test_a_real_vllm_page_gives_its_running_and_waiting_requests_and_its_kv_pool() -> None:
    # vLLM 0.32.0's CPU build as bench/vllm_pool.py starts it: a pool of 16,384 tokens (128
    # blocks, one kept empty), at most 2 running, 4 long requests sent, 10 blocks in use.
    text = (CAPTURED / "vllm-0.32.0-cpu.metrics.txt").read_text()
    assert parse_load(text) == Load(running=2, waiting=2, kv_total=16384, kv_used=1290)


def test_vllms_stated_token_count_wins_over_its_blocks_when_they_differ() -> None:
    # The same build with its hybrid KV manager (a 1 GiB pool, 2,730 blocks of 128 tokens):
    # sliding-window layers hold only their window, and vLLM states 191,967 tokens, not the
    # 349,440 its blocks would give; the usage share is of the blocks.
    text = (CAPTURED / "vllm-0.32.0-cpu-hybrid-kv.metrics.txt").read_text()
    assert 'num_gpu_blocks="2730"' in text and 'block_size="128"' in text
    assert parse_load(text) == Load(running=2, waiting=2, kv_total=191967, kv_used=2532)


def test_vllm_older_usage_name_is_read() -> None:
    text = VLLM_KV.replace("kv_cache_usage_perc", "gpu_cache_usage_perc")
    assert parse_load(text) == Load(running=6, waiting=1, kv_total=32000, kv_used=16000)


def test_missing_or_malformed_kv_figures_leave_the_pool_unknown() -> None:
    assert parse_load(SGLANG) == Load(running=7, waiting=3)
    bad = VLLM + 'vllm:cache_config_info{num_gpu_blocks="None",block_size="16"} 1\n'
    assert parse_load(bad) == Load(running=6, waiting=1)
    assert parse_load(SGLANG + "sglang:max_total_num_tokens 0\n") == Load(running=7, waiting=3)


def test_the_simulators_own_metrics_give_its_pool() -> None:
    from luftpause.testkit.engine.core import EngineCore
    from luftpause.testkit.engine.metrics import ShellCounters, render
    from luftpause.testkit.engine.params import EngineParams

    stats = EngineCore(EngineParams(kv_tokens=4096)).stats()
    shell = ShellCounters(
        requests_total=0,
        rate_limited_total=0,
        rejected_total=0,
        steps_total=0,
        busy_ms_total=0.0,
        lag_seconds=0.0,
    )
    load = parse_load(render(stats, shell, model="m", replica="e"))
    assert load == Load(running=0, waiting=0, kv_total=4096, kv_used=0)
