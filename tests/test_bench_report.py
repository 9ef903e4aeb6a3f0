"""bench/results/RESULTS.md is what `python -m bench.report` makes of the JSON beside it."""

from __future__ import annotations

from bench.report import RESULTS, load_floods, render
from bench.scheduler_core import comparison_section


def test_results_markdown_is_fresh() -> None:
    committed = (RESULTS / "RESULTS.md").read_text()
    assert render(load_floods()) == committed, "stale: run `python -m bench.report`"


def test_the_core_comparison_shows_both_commits_and_their_ratio() -> None:
    arm = {"events_per_s": 20000, "events_per_s_min": 19000, "events_per_s_max": 21000}
    old = {"events_per_s": 10000, "events_per_s_min": 9000, "events_per_s_max": 11000}
    data = {
        "replicas": 32,
        "events": 1000,
        "repeats": 3,
        "comparison": [
            {
                "against": "0123456789abcdef",
                "rows": [{"runs": 10000, "saturated": True, "new": arm, "old": old, "ratio": 2.0}],
            }
        ],
    }
    text = comparison_section(data)
    assert "--against 0123456789`" in text
    assert (
        "| saturated | 10,000 | 20,000 (19,000..21,000) | 10,000 (9,000..11,000) | 2.0x |" in text
    )
