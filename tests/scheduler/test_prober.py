"""Reading engine load from Prometheus text (pure, no sockets)."""

from __future__ import annotations

from luftpause.scheduler.prober import Load, parse_load

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
