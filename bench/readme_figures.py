"""The README's measured figures, each rendered from the result file it cites.

Run: `.venv/bin/python -m bench.readme_figures` prints every figure the README should show and
whether it does. Each `Figure` names its result file (bench/results/NAME.json) and renders the
exact text the README carries for it, so a rerun that moves a number fails the test
(tests/test_readme_figures.py) until the README says what the file says, and a figure that no
file backs cannot be registered. The files record the commit they ran on (`machine.commit`,
bench.common.provenance), which the README says under each table.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
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


def matrix_row(label: str, cell: str) -> Callable[[dict[str, Any]], str]:
    """A row of the README's matrix table: its label, then interactive and batch ratios."""

    def render(data: dict[str, Any]) -> str:
        results = data["cells"][cell]["results"]
        v = verdict(cell, arm_figures(results[OURS]), arm_figures(results[BASELINE]))
        return f"| {label} | {x(v['interactive_x'])} | {x(v['batch_x'])} |"

    return render


def medians_line(cell: str) -> Callable[[dict[str, Any]], str]:
    """`3.6 against 3.5 interactive and 10.4 against 9.8 batch runs/min`: luftpause's and
    cache_aware's medians over the repeats."""

    def render(data: dict[str, Any]) -> str:
        results = data["cells"][cell]["results"]
        ours, base = arm_figures(results[OURS]), arm_figures(results[BASELINE])
        return (
            f"{statistics.median(ours['interactive']):.1f} against "
            f"{statistics.median(base['interactive']):.1f} "
            f"interactive and {statistics.median(ours['batch']):.1f} against "
            f"{statistics.median(base['batch']):.1f} batch runs/min"
        )

    return render


def _med(figures: dict[str, Any], key: str) -> float:
    value: float = figures[key]["median"]
    return value


def ratelimit_row(label: str, scenario: str) -> Callable[[dict[str, Any]], str]:
    """A row of the README's rate-limit table: medians over the seeds of the 429s at the
    provider (direct with the openai defaults, a patient client, LiteLLM, luftpause without
    `limits`), the errors clients saw (direct, LiteLLM, luftpause), luftpause's wall clock over
    the earliest the budgets allow (direct's), and the turn p90 (LiteLLM, luftpause)."""

    def render(data: dict[str, Any]) -> str:
        arms = data["scenarios"][scenario]["summary"]
        refused = " / ".join(
            f"{_med(arms[a], 'provider_429s'):g}"
            for a in ("direct", "direct-patient", "litellm", "luftpause")
        )
        errors = " / ".join(
            f"{_med(arms[a], 'errors'):g}" for a in ("direct", "litellm", "luftpause")
        )
        wall = (
            f"{_med(arms['luftpause'], 'wall_over_earliest'):.2f} "
            f"({_med(arms['direct'], 'wall_over_earliest'):.2f})"
        )
        p90 = (
            f"{_med(arms['litellm'], 'turn_p90_s'):.1f} / "
            f"{_med(arms['luftpause'], 'turn_p90_s'):.1f} s"
        )
        return f"| {label} | {refused} | {errors} | {wall} | {p90} |"

    return render


def family_line(data: dict[str, Any]) -> str:
    """The family's distribution of luftpause / cache_aware, batch then interactive runs/min,
    and the models behind on both classes with their ratios (and their standard errors over
    the seeds, where pooled)."""
    s = data["summary"]
    b, i = s["batch"], s["interactive"]
    models = {m["name"]: m for m in data["models"]}

    def named(name: str) -> str:
        r, se = models[name]["ratio"], models[name].get("ratio_se")
        text = f"{name} {r['interactive']:.3f}x / {r['batch']:.3f}x"
        if se and se["interactive"] is not None and se["batch"] is not None:
            text += f" (± {se['interactive']:.3f} / {se['batch']:.3f})"
        return text

    behind = ", ".join(named(name) for name in s["behind"])
    return (
        f"batch at a median of {b['median']:.2f}x (worst {b['min']:.2f}x, 10th percentile "
        f"{b['p10']:.2f}x), interactive {i['median']:.2f}x (90th percentile {i['p90']:.2f}x, "
        f"best {i['max']:.2f}x); behind on both classes: {behind or 'none'}"
    )


def model_line(name: str) -> Callable[[dict[str, Any]], str]:
    """One pooled model's ratios with their standard errors: `0.978x ± 0.007 interactive and
    0.996x ± 0.004 batch`."""

    def render(data: dict[str, Any]) -> str:
        m = next(m for m in data["models"] if m["name"] == name)
        r, se = m["ratio"], m["ratio_se"]
        return (
            f"{r['interactive']:.3f}x ± {se['interactive']:.3f} interactive and "
            f"{r['batch']:.3f}x ± {se['batch']:.3f} batch"
        )

    return render


RATELIMIT_ROWS = (
    ("fixed window", "fixed-openai"),
    ("token bucket", "continuous-openai"),
    ("token bucket, input and output budgets", "continuous-anthropic"),
    ("two providers of one model", "two-providers"),
)

FIGURES: list[Figure] = [
    Figure(
        "matrix, llama.cpp plain messages",
        "matrix_real_settle_text.json",
        matrix_row("llama.cpp, tool results as plain messages", "real-text"),
    ),
    Figure(
        "matrix, llama.cpp tool calls",
        "matrix_real_settle_openai.json",
        matrix_row("llama.cpp, tool calls", "real-openai"),
    ),
    Figure(
        "matrix, llama.cpp plain messages: the medians",
        "matrix_real_settle_text.json",
        medians_line("real-text"),
    ),
    Figure(
        "matrix, vLLM tool calls",
        "matrix_real_vllm.json",
        matrix_row("vLLM's CPU build, tool calls", "vllm-openai"),
    ),
    Figure(
        "matrix, vLLM plain messages",
        "matrix_real_vllm.json",
        matrix_row("vLLM's CPU build, tool results as plain messages", "vllm-text"),
    ),
    Figure(
        "matrix, vLLM tool calls: the medians", "matrix_real_vllm.json", medians_line("vllm-openai")
    ),
    Figure(
        "matrix, vLLM plain messages: the medians",
        "matrix_real_vllm.json",
        medians_line("vllm-text"),
    ),
]
FIGURES.append(Figure("family, pooled over seeds", "family_lab_pooled.json", family_line))
FIGURES.append(
    Figure(
        "family, sglang-26-28 at twelve seeds",
        "family_lab_s28_pooled.json",
        model_line("sglang-26-28"),
    )
)
FIGURES += [
    Figure(f"rate limits, {label}", "ratelimit_realtime.json", ratelimit_row(label, scenario))
    for label, scenario in RATELIMIT_ROWS
]
"""The README's figures, each with the result file it cites."""


def _flat(text: str) -> str:
    """`text` with every run of whitespace one space: a figure may wrap across lines."""
    return " ".join(text.split())


def check(readme: str, figures: list[Figure] | None = None) -> list[str]:
    """What the README gets wrong: one line per figure whose rendered text it lacks."""
    wrong = []
    flat = _flat(readme)
    for f in FIGURES if figures is None else figures:
        if not (RESULTS / f.source).exists():
            wrong.append(f"{f.what}: its result file {f.source} is missing")
            continue
        text = f.text()
        if _flat(text) not in flat:
            wrong.append(f"{f.what}: the README should read {text!r} ({f.source})")
    return wrong


def main() -> None:
    readme = README.read_text()
    for f in FIGURES:
        text = f.text() if (RESULTS / f.source).exists() else "(missing)"
        mark = "ok  " if _flat(text) in _flat(readme) else "WRONG"
        print(f"{mark} {f.what} [{f.source}]: {text}")
    wrong = check(readme)
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
