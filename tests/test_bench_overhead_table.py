"""bench.overhead's CPU per turn, process by process: the dataplane's and the scheduler's shares."""

from __future__ import annotations

from typing import Any

from bench.overhead import _compare
from bench.overhead_table import table


def _round(cpu_each: list[float] | None, turns: int = 100) -> dict[str, Any]:
    stats = {"p50": 1.0, "p99": 2.0}
    out: dict[str, Any] = {"ttfb": stats, "total": stats, "rps": 500.0}
    if cpu_each is not None:
        out |= {"cpu_ms": sum(cpu_each), "cpu_ms_each": cpu_each, "turns": turns}
    return out


def _results(each: list[list[float]]) -> dict[str, Any]:
    per_arm = {"direct": [_round(None)] * len(each), "dataplane": [_round(e) for e in each]}
    compared = _compare(per_arm)
    return {f"c{c}_{k}": compared for c in (1, 32) for k in ("stream", "nonstream")}


def test_each_process_gets_its_own_cpu_per_turn_beside_the_total() -> None:
    results = _results([[60.0, 12.0], [62.0, 16.0], [58.0, 14.0]])
    dataplane = results["c1_stream"]["arms"]["dataplane"]
    assert dataplane["cpu_ms_per_turn"]["median"] == 0.72
    assert [v["median"] for v in dataplane["cpu_ms_per_turn_each"]] == [0.6, 0.14]
    assert "| dataplane | 0.60 / 0.14 | 0.60 / 0.14 | 0.60 / 0.14 | 0.60 / 0.14 |" in table(results)


def test_an_arm_of_one_process_has_no_split() -> None:
    results = _results([[50.0], [52.0]])
    assert "cpu_ms_per_turn_each" not in results["c1_stream"]["arms"]["dataplane"]
    assert "by process" not in table(results)
