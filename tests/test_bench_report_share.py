"""The report's cached share over both classes weighs each class by its prompt tokens."""

from __future__ import annotations

from bench.report import all_share, flood_table


def _rep(i: tuple[int, int], b: tuple[int, int]) -> dict[str, dict[str, float]]:
    def cls(prompt: int, cached: int) -> dict[str, float]:
        share = cached / prompt
        return {
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "cached_share": share,
            "errors": 0,
        }

    return {"interactive": cls(*i), "batch": cls(*b)}


def test_all_classes_share_is_weighted_by_tokens_not_an_average_of_shares() -> None:
    # interactive 90 % of 100 tokens, batch 50 % of 900: 540 of 1,000, not (0.9 + 0.5) / 2
    assert all_share(_rep((100, 90), (900, 450))) == 0.54


def test_results_without_token_counts_have_no_all_classes_share() -> None:
    old = {"interactive": {"cached_share": 0.7}, "batch": {"cached_share": 0.6}}
    assert all_share(old) is None


def test_the_table_shows_batch_and_all_classes_shares() -> None:
    rows = flood_table({"luftpause": [_rep((100, 90), (900, 450))]}).splitlines()
    assert "cached prompt share: batch / all (agents)" in rows[0]
    assert "| 0.5 / 0.54 |" in rows[2]
