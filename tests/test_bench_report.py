"""bench/results/RESULTS.md is what `python -m bench.report` makes of the JSON beside it."""

from __future__ import annotations

from bench.report import RESULTS, load_floods, render


def test_results_markdown_is_fresh() -> None:
    committed = (RESULTS / "RESULTS.md").read_text()
    assert render(load_floods()) == committed, "stale: run `python -m bench.report`"
