"""Helpers shared by the benchmarks: percentiles, machine facts, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def percentiles(samples: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """p50/p90/p99/max/mean of `samples` (seconds) in milliseconds by default."""
    if not samples:
        return {}
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)] * scale

    return {
        "n": len(ordered),
        "p50": round(pick(0.50), 4),
        "p90": round(pick(0.90), 4),
        "p99": round(pick(0.99), 4),
        "max": round(ordered[-1] * scale, 4),
        "mean": round(statistics.fmean(ordered) * scale, 4),
    }


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def rotated(arms: Sequence[str], repeat: int) -> list[str]:
    """The arms in the order repeat `repeat` (from 0) runs them: each repeat starts one arm
    later, so drift on a busy machine (and whatever runs first) hits every arm alike."""
    if not arms:
        return []
    k = repeat % len(arms)
    return [*arms[k:], *arms[:k]]


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2) + "\n")
    return path
