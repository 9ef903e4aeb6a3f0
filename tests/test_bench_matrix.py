"""The workload matrix's cells, the arguments each runs with, and its table (pure)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench.matrix import Cell, all_cells, cell_args
from bench.matrix_report import matrix_table, verdict


def test_the_matrix_has_sixteen_simulated_cells_and_four_real_ones() -> None:
    sim, real = all_cells("sim"), all_cells("real")
    assert len(sim) == len(set(sim)) == 16 and [c.name for c in real] == [
        "real-openai",
        "real-text",
        "vllm-openai",
        "vllm-text",
    ]
    assert {c.engine for c in sim} == {"kv", "slots"}
    assert all_cells("all") == [*sim, *real]


@pytest.mark.parametrize(
    "name", ["kv-text-shared-thrash", "slots-openai-unique-fits", "real-text", "vllm-text"]
)
def test_a_cell_name_parses_back_to_its_cell(name: str) -> None:
    assert Cell.parse(name).name == name


@pytest.mark.parametrize(
    "name", ["kv-xml-unique-fits", "real-text-unique-fits", "vllm-text-shared-fits", "gpu-openai"]
)
def test_an_unknown_cell_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="unknown cell"):
        Cell.parse(name)


def test_cells_set_the_engine_the_tool_style_the_preamble_and_the_pool() -> None:
    a = argparse.Namespace(time_scale=10.0, real_window_s=180.0, seed=1)
    kv = cell_args(Cell.parse("kv-text-shared-thrash"), a)
    assert (kv.admission, kv.max_running, kv.kv_tokens) == ("sglang", 48, 36_000)
    assert (kv.tool_style, kv.keep_tools, kv.shared_prefix_chars) == ("text", False, 4000)
    assert kv.context_chars + kv.shared_prefix_chars == 10_000
    assert kv.window_s * kv.time_scale == 300.0
    slots = cell_args(Cell.parse("slots-openai-unique-fits"), a)
    assert (slots.admission, slots.max_running, slots.kv_tokens) == ("reserve", 8, 150_000)
    assert slots.keep_tools and slots.shared_prefix_chars == 0
    real = cell_args(Cell.parse("real-openai"), a)
    assert (real.pool, real.real_parallel, real.window_s, real.batch) == ("real", 2, 180.0, 6)
    vllm = cell_args(Cell.parse("vllm-text"), a)
    assert (vllm.pool, vllm.batch, vllm.interactive, vllm.kv_tokens) == ("vllm", 24, 4, 16_384)
    assert not vllm.keep_tools and not vllm.engine_priority


def rep(interactive: float, batch: float, cached: float = 0.5) -> dict[str, Any]:
    def cls(rate: float) -> dict[str, Any]:
        return {
            "runs_per_min": rate,
            "run_time_p50_s": 10.0,
            "prompt_tokens": 1000,
            "cached_tokens": round(1000 * cached),
        }

    return {"interactive": cls(interactive), "batch": cls(batch)}


def test_the_verdict_compares_medians_and_names_the_targets_missed() -> None:
    cells = {
        "kv-openai-unique-thrash": {
            "results": {
                "router-cache_aware": [rep(8, 80), rep(7, 90), rep(9, 85)],
                "luftpause": [rep(24, 130, 0.6), rep(20, 128, 0.6), rep(22, 131, 0.6)],
                "interactive-alone": [rep(30, 0)],
            }
        },
        "kv-openai-unique-fits": {
            "results": {
                "router-cache_aware": [rep(10, 100)],
                "luftpause": [rep(25, 85)],
            }
        },
    }
    table = matrix_table(cells)
    thrash, fits = table.splitlines()[2:]
    assert "2.75x, 1.53x" in thrash and "30.0 (3.75x)" in thrash and thrash.endswith("| none |")
    assert "2.50x, 0.85x" in fits and "2x interactive at 0.9x batch" in fits
    behind = verdict(
        "x-fits",
        {"interactive": [9], "batch": [90], "cached": []},
        {"interactive": [10], "batch": [100], "cached": []},
    )
    assert behind["targets"]["not behind on both"] is False
