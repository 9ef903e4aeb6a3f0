"""bench.router_ttfb's pure parts: which arms run, what each adds over its own direct arm."""

from __future__ import annotations

from typing import Any

from bench.router_ttfb import summarize_arms, table, with_baselines


def _round(ttfb_p50: float, nodelay: list[int] | None = None) -> dict[str, Any]:
    stats = {"p50": ttfb_p50, "p90": ttfb_p50 + 1}
    return {
        "ttfb": stats,
        "total": stats,
        "server_nodelay": nodelay,
        "delayed_acks_per_request": 1.0 if ttfb_p50 > 40 else 0.0,
        "load": {"cpu_busy_share": 0.5},
    }


def test_every_chosen_arm_runs_beside_the_direct_arm_it_is_measured_against() -> None:
    names = [a.name for a in with_baselines(["router-openai", "router-nonstream", "luftpause"])]
    assert names == [
        "direct",
        "luftpause",
        "direct-openai",
        "router-openai",
        "direct-nonstream",
        "router-nonstream",
    ]


def test_added_time_is_round_by_round_over_the_direct_arm_of_the_same_kind() -> None:
    per_arm = {
        "direct": [_round(0.5, [1]), _round(0.7, [1])],
        "router-cache_aware": [_round(44.5, [0]), _round(43.7, [0])],
        "router-nodelay": [_round(1.5, [0]), _round(1.7, [0])],
        "direct-nonstream": [_round(0.4), _round(0.4)],
        "router-nonstream": [_round(0.9), _round(1.0)],
    }
    summary = summarize_arms(per_arm)
    assert summary["router-cache_aware"]["added_ttfb_p50_ms"] == {
        "median": 43.5,
        "min": 43.0,
        "max": 44.0,
    }
    assert summary["router-nonstream"]["added_ttfb_p50_ms"]["median"] == 0.55
    assert "added_ttfb_p50_ms" not in summary["direct"]
    assert summary["router-cache_aware"]["server_nodelay"] == [0]
    assert summary["router-nonstream"]["server_nodelay"] == []
    assert summary["router-cache_aware"]["delayed_acks_per_request"]["median"] == 1.0
    text = table(summary)
    assert "| router-cache_aware | 44.10 (43.70..44.50) |" in text
    assert text.count("\n") == len(per_arm) + 1
