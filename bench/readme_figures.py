"""The README's measured figures, each rendered from the result file it cites.

Run: `.venv/bin/python -m bench.readme_figures` prints every figure the README should show and
whether it does. Each `Figure` names its result file (bench/results/NAME.json) and renders the
exact text the README carries for it, so a rerun that moves a number fails the test
(tests/test_readme_figures.py) until the README says what the file says, and a figure that no
file backs cannot be registered. The files record the commit they ran on (`machine.commit`,
bench.common.provenance); `commit_note` renders the line under a table that says so.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS
from bench.matrix_report import BASELINE, OURS, arm_figures, verdict

README = RESULTS.parent.parent / "README.md"


@dataclass(frozen=True, slots=True)
class Figure:
    what: str
    source: str
    render: Callable[[dict[str, Any]], str]

    def text(self) -> str:
        return self.render(load(self.source))


def load(source: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / source).read_text())
    return data


def x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def commit_note(data: dict[str, Any]) -> str:
    """`commit abcdef123456` of the run (with `, uncommitted changes` when the tree had any)."""
    m = data.get("machine", {})
    commit = m.get("commit") or "unknown"
    return f"commit {commit[:12]}" + (", uncommitted changes" if m.get("dirty") else "")


def matrix_cell(cell: str) -> Callable[[dict[str, Any]], str]:
    """A matrix cell's ratios, interactive then batch, of the arms' medians over repeats, and
    the repeats' spread of each arm (`1.15x / 1.13x`)."""

    def render(data: dict[str, Any]) -> str:
        results = data["cells"][cell]["results"]
        v = verdict(cell, arm_figures(results[OURS]), arm_figures(results[BASELINE]))
        return f"{x(v['interactive_x'])} / {x(v['batch_x'])}"

    return render


def matrix_repeats(cell: str) -> Callable[[dict[str, Any]], str]:
    def render(data: dict[str, Any]) -> str:
        reps = data["cells"][cell]["results"]
        n = min(len(reps[OURS]), len(reps[BASELINE]))
        window = data["cells"][cell]["args"].get("window_s")
        return f"{n} repeats of {window:g} s"

    return render


def family_spread(cls: str, key: str = "summary") -> Callable[[dict[str, Any]], str]:
    """The family's ratios for a class: min, 10th percentile, median, 90th percentile, max."""

    def render(data: dict[str, Any]) -> str:
        s = data[key][cls]
        return (
            f"{cls} {s['median']:.2f}x (min {s['min']:.2f}x, p10 {s['p10']:.2f}x, "
            f"p90 {s['p90']:.2f}x, max {s['max']:.2f}x)"
        )

    return render


def family_behind(data: dict[str, Any]) -> str:
    behind = data["summary"]["behind"]
    seeds = data.get("seeds", [data.get("args", {}).get("seed", 1)])
    models = data["summary"]["models"]
    where = "none" if not behind else ", ".join(behind)
    return f"{models} models, {len(seeds)} workload seeds each; behind: {where}"


def median_of(values: list[float]) -> float:
    return statistics.median(values)


FIGURES: list[Figure] = []
"""The README's figures; filled in by the sections below as each table is regenerated."""


def register(*figures: Figure) -> None:
    FIGURES.extend(figures)


def check(readme: str, figures: list[Figure] | None = None) -> list[str]:
    """What the README gets wrong: one line per figure whose rendered text it lacks."""
    wrong = []
    for f in FIGURES if figures is None else figures:
        if not (RESULTS / f.source).exists():
            wrong.append(f"{f.what}: its result file {f.source} is missing")
            continue
        text = f.text()
        if text not in readme:
            wrong.append(f"{f.what}: the README should read {text!r} ({f.source})")
    return wrong


def main() -> None:
    readme = README.read_text()
    for f in FIGURES:
        text = f.text() if (RESULTS / f.source).exists() else "(missing)"
        mark = "ok  " if text in readme else "WRONG"
        print(f"{mark} {f.what} [{f.source}]: {text}")
    wrong = check(readme)
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
