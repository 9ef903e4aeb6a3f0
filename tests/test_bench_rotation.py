"""Benchmarks that compare arms run them in an order rotated per repeat, and each arm's entry
carries the machine's load while it ran: their per-repeat loops, driven with fake arms."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bench import flood
from bench.admit_rtt import pooled
from bench.overhead import _compare, rounds
from bench.scheduler_core import summary

LOAD = {"load_1m_start", "load_1m_end", "cpu_busy_share", "seconds"}


async def test_overhead_rotates_its_arms_round_by_round_and_keeps_each_rounds_load() -> None:
    ran: list[str] = []

    async def measure(name: str) -> dict[str, Any]:
        ran.append(name)
        stats = {"p50": float(len(ran)), "p99": 2.0 * len(ran)}
        return {"ttfb": stats, "total": stats, "rps": 100.0}

    per_arm = await rounds(("direct", "dataplane", "litellm"), 3, measure)
    assert ran == [
        *("direct", "dataplane", "litellm"),
        *("dataplane", "litellm", "direct"),
        *("litellm", "direct", "dataplane"),
    ]
    # Each arm's rounds stay in round order, so arms pair round by round against `direct`.
    assert [r["ttfb"]["p50"] for r in per_arm["direct"]] == [1.0, 6.0, 8.0]
    assert all(set(r["load"]) == LOAD for rs in per_arm.values() for r in rs)
    compared = _compare(per_arm)
    assert compared["added_ms"]["dataplane_ttfb_p50"] == {"median": 1.0, "min": -2.0, "max": 1.0}
    assert [len(compared["arms"][name]["load"]) for name in per_arm] == [3, 3, 3]


def _class(rate: float) -> dict[str, Any]:
    times = dict.fromkeys(("run_time_p50_s", "run_time_p99_s", "ttft_p50_s", "ttft_p99_s"), 1.0)
    return {"runs_per_min": rate, "errors": 0, **times}


async def test_the_flood_rotates_its_arms_per_repeat_and_records_each_arms_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[str] = []

    async def one_arm(arm: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
        ran.append(arm)
        return {"interactive": _class(8.0), "batch": _class(40.0), "engines": {}}

    monkeypatch.setattr(flood, "one_arm", one_arm)
    monkeypatch.setattr(flood.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    arms = ["router-cache_aware", "router-cache_aware-priority", "luftpause"]
    out = await flood.main_async(argparse.Namespace(arms=arms, repeats=4, time_scale=4.0))
    rotations = [arms, [arms[1], arms[2], arms[0]], [arms[2], arms[0], arms[1]], arms]
    assert [ran[i : i + 3] for i in (0, 3, 6, 9)] == out["orders"] == rotations
    for reps in out["results"].values():
        assert len(reps) == 4
        for rep in reps:
            assert set(rep["load"]) == LOAD and rep["load"]["seconds"] >= 0
            assert rep["interactive"]["runs_per_min"] == 2.0  # in simulated time (8 / 4)
    assert "| luftpause | 2 / 2 / 2 / 2 |" in out["table"]


def _admissions(seconds: float, cpu: float, achieved: float, took: float) -> dict[str, Any]:
    """One repeat of an admission arm: 4 sequential round trips, one paced."""
    return {
        "sequential": [seconds] * 4,
        "cpu": cpu,
        "paced": [2 * seconds],
        "achieved": achieved,
        "load": {**dict.fromkeys(LOAD, 0.0), "seconds": took},
    }


def test_admission_samples_pool_over_repeats_with_each_repeats_load() -> None:
    runs = [_admissions(0.001, 0.004, 990.0, 1.0), _admissions(0.003, 0.012, 1000.0, 2.0)]
    arm = pooled(runs, argparse.Namespace(sequential=4, rate=1000.0))
    assert arm["sequential_ms"]["n"] == 8 and arm["sequential_ms"]["max"] == 3.0
    assert arm["scheduler_cpu_ms_per_admit_sequential"] == 2.0  # 16 ms over 8 admissions
    assert arm["paced"]["achieved_rate"] == 995.0 and arm["paced"]["rtt_ms"]["n"] == 2
    assert [r["seconds"] for r in arm["load"]] == [1.0, 2.0]


def test_the_core_against_another_commit_keeps_every_trials_load() -> None:
    trials = [
        {"runs": 10, "events_per_s": rate, "held_at_end": 0, "load": {"seconds": float(k)}}
        for k, rate in enumerate((300, 100, 200))
    ]
    row = summary(trials)
    rates = (row["events_per_s"], row["events_per_s_min"], row["events_per_s_max"])
    assert rates == (200, 100, 300)
    assert row["load"] == [{"seconds": 0.0}, {"seconds": 1.0}, {"seconds": 2.0}]
    assert "load" not in summary([{k: v for k, v in t.items() if k != "load"} for t in trials])
