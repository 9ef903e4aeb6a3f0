"""The workload matrix as a Markdown table and a figure (bench.matrix's results).

Pure formatting apart from `plot`, which writes a PNG. Per cell and arm: interactive and batch
runs/min (median over repeats, with min..max), the share of prompt tokens the agents got from
cache (both classes), and luftpause against cache_aware with the issue's targets:

- every cell: interactive runs/min at least TARGET_INTERACTIVE times cache_aware's with batch at
  least TARGET_BATCH times, and never behind cache_aware on both;
- thrash cells: batch at least THRASH_BATCH times and interactive THRASH_INTERACTIVE times
  cache_aware's, with at least THRASH_CACHED of the prompt tokens from cache.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

BASELINE = "router-cache_aware"
OURS = "luftpause"
ALONE = "interactive-alone"
TARGET_INTERACTIVE = 2.0
TARGET_BATCH = 0.9
THRASH_INTERACTIVE = 2.5
THRASH_BATCH = 1.5
THRASH_CACHED = 0.5


def _values(reps: list[dict[str, Any]], cls: str, key: str) -> list[float]:
    return [r[cls][key] for r in reps if r.get(cls, {}).get(key) is not None]


def cached_share(rep: dict[str, Any]) -> float | None:
    """One repeat's share of prompt tokens from cache over both classes (agents' usage)."""
    classes = [rep.get(cls, {}) for cls in ("interactive", "batch")]
    if any(c.get("prompt_tokens") is None for c in classes):
        return None
    prompt = sum(c["prompt_tokens"] for c in classes)
    return sum(c["cached_tokens"] for c in classes) / prompt if prompt else None


def arm_figures(reps: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per repeat: interactive and batch runs/min, cached share, interactive run time p50."""
    return {
        "interactive": _values(reps, "interactive", "runs_per_min"),
        "batch": _values(reps, "batch", "runs_per_min"),
        "cached": [v for r in reps if (v := cached_share(r)) is not None],
        "p50": _values(reps, "interactive", "run_time_p50_s"),
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def verdict(
    name: str,
    ours: dict[str, list[float]],
    base: dict[str, list[float]],
    alone: dict[str, list[float]] | None = None,
) -> dict[str, Any]:
    """luftpause against cache_aware in one cell: ratios of medians, the targets met, and the
    ceiling of the interactive ratio (the interactive agents alone against cache_aware)."""
    oi, bi = _median(ours["interactive"]), _median(base["interactive"])
    ob, bb = _median(ours["batch"]), _median(base["batch"])
    cached = _median(ours["cached"])
    ix = oi / bi if oi is not None and bi else None
    bx = ob / bb if ob is not None and bb else None
    out: dict[str, Any] = {"interactive_x": ix, "batch_x": bx, "cached": cached}
    ai = _median(alone["interactive"]) if alone else None
    out["ceiling_x"] = ai / bi if ai is not None and bi else None
    if ix is None or bx is None:
        return out
    targets = {
        "2x interactive at 0.9x batch": ix >= TARGET_INTERACTIVE and bx >= TARGET_BATCH,
        "not behind on both": ix >= 1.0 or bx >= 1.0,
    }
    if name.endswith("-thrash"):
        targets["thrash: 2.5x interactive, 1.5x batch, half cached"] = (
            ix >= THRASH_INTERACTIVE
            and bx >= THRASH_BATCH
            and cached is not None
            and cached >= THRASH_CACHED
        )
    out["targets"] = targets
    return out


def matrix_table(cells: dict[str, Any]) -> str:
    """One row per cell: each arm's interactive / batch runs/min and cached share, the ratios,
    the interactive agents alone, and the targets missed."""
    order = (BASELINE, "router-round_robin", OURS)
    arms = [a for a in order if any(a in c["results"] for c in cells.values())]
    head = ["cell", *(f"{a}: interactive / batch runs/min, cached" for a in arms)]
    head += [
        "luftpause / cache_aware: interactive, batch",
        "interactive alone (ceiling)",
        "targets missed",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, cell in cells.items():
        figures = {arm: arm_figures(reps) for arm, reps in cell["results"].items()}
        row = [name]
        for arm in arms:
            f = figures.get(arm)
            if f is None:
                row.append("-")
                continue
            cached = _median(f["cached"])
            row.append(
                f"{_spread(f['interactive'])} / {_spread(f['batch'], 0)}, "
                f"{'-' if cached is None else f'{cached:.0%}'}"
            )
        v: dict[str, Any] = {}
        if OURS in figures and BASELINE in figures:
            v = verdict(name, figures[OURS], figures[BASELINE], figures.get(ALONE))
        ix, bx, cx = v.get("interactive_x"), v.get("batch_x"), v.get("ceiling_x")
        row.append("-" if ix is None or bx is None else f"{ix:.2f}x, {bx:.2f}x")
        alone = _median(figures[ALONE]["interactive"]) if ALONE in figures else None
        row.append("-" if alone is None else f"{alone:.1f}" + (f" ({cx:.2f}x)" if cx else ""))
        missed = [t for t, ok in v.get("targets", {}).items() if not ok]
        row.append("; ".join(missed) if missed else ("none" if v.get("targets") else "-"))
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


ABLATIONS = (
    "luftpause-nokv",
    "luftpause-nosoft",
    "luftpause-noopenings",
    "luftpause-noshare",
    "luftpause-nopriority",
    "luftpause-free",
    "luftpause-headroom",
)


def ablation_table(cells: dict[str, Any]) -> str:
    """What each rule earns, per cell that ran its ablation: luftpause's interactive and batch
    runs/min over the arm with that rule switched off (above 1: the rule pays)."""
    arms = [a for a in ABLATIONS if any(a in c["results"] for c in cells.values())]
    if not arms:
        return ""
    head = ["cell", *(f"luftpause / {a.removeprefix('luftpause-')}" for a in arms)]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, cell in cells.items():
        results = cell["results"]
        if OURS not in results or not any(a in results for a in arms):
            continue
        ours = arm_figures(results[OURS])
        row = [name]
        for arm in arms:
            if arm not in results:
                row.append("-")
                continue
            other = arm_figures(results[arm])
            ratio = [
                (_median(ours[c]) or 0.0) / d
                for c in ("interactive", "batch")
                if (d := _median(other[c]))
            ]
            row.append("-" if len(ratio) < 2 else f"{ratio[0]:.2f}x, {ratio[1]:.2f}x")
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def plot(cells: dict[str, Any], path: Path) -> None:
    """Each cell as a point: luftpause's batch and interactive runs/min over cache_aware's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 6))
    ax.axvspan(TARGET_BATCH, 10, ymin=0, ymax=1, color="#e8f3e8", zorder=0)
    ax.axhline(TARGET_INTERACTIVE, color="#2ca02c", lw=0.8, ls="--")
    ax.axvline(TARGET_BATCH, color="#2ca02c", lw=0.8, ls="--")
    ax.axhline(1.0, color="#999999", lw=0.6)
    ax.axvline(1.0, color="#999999", lw=0.6)
    xs: list[float] = []
    ys: list[float] = []
    for name, cell in cells.items():
        results = cell["results"]
        if OURS not in results or BASELINE not in results:
            continue
        v = verdict(name, arm_figures(results[OURS]), arm_figures(results[BASELINE]))
        if v.get("interactive_x") is None or v.get("batch_x") is None:
            continue
        x, y = v["batch_x"], v["interactive_x"]
        xs.append(x)
        ys.append(y)
        marker = {"kv": "o", "slots": "s", "real": "^", "vllm": "v"}.get(name.split("-")[0], "x")
        color = "#d62728" if name.endswith("-thrash") else "#1f77b4"
        ax.scatter([x], [y], marker=marker, color=color, zorder=3)
        ax.annotate(name, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    if xs:
        ax.set_xlim(min(0.4, min(xs) - 0.1), max(2.0, max(xs) + 0.2))
        ax.set_ylim(min(0.4, min(ys) - 0.1), max(3.0, max(ys) + 0.3))
    ax.set_xlabel("batch runs/min, luftpause / cache_aware (median of repeats)")
    ax.set_ylabel("interactive runs/min, luftpause / cache_aware")
    ax.set_title(
        "Workload matrix: circles KV-bound, squares slot-bound, triangles llama.cpp; "
        "red: KV thrash",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
