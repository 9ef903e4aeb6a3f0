"""The README's measured figures are what the result files they cite say (bench.readme_figures)."""

from __future__ import annotations

import copy

from bench.readme_figures import FIGURES, README, Figure, check, family_again_line, load, matrix_row


def test_every_registered_figure_reads_in_the_readme_as_its_result_file_says() -> None:
    assert check(README.read_text()) == []


def test_a_figure_the_readme_misstates_is_reported_with_what_it_should_read() -> None:
    figure = Figure("matrix row", "matrix_real_settle_text.json", matrix_row("row", "real-text"))
    (wrong,) = check("| row | 9.99x | 9.99x |", [figure])
    assert "matrix row: the README should read '| row | 1.03x | 1.06x |'" in wrong


def test_a_figure_whose_file_is_gone_is_reported() -> None:
    figure = Figure("gone", "no_such_result.json", matrix_row("row", "real-text"))
    assert check("", [figure]) == ["gone: its result file no_such_result.json is missing"]


def test_every_figure_cites_a_file_the_readme_links() -> None:
    readme = README.read_text()
    for f in FIGURES:
        assert f"bench/results/{f.source}" in readme, f.what


def test_the_family_run_again_reads_the_same_only_when_every_figure_is() -> None:
    again = load("family_check_s41.json")
    assert family_again_line(again).endswith(", every figure of every model the same to the digit")
    changed = copy.deepcopy(again)
    changed["models"][0]["ratio"] = {"interactive": 9.99, "batch": 9.99}
    assert family_again_line(changed).endswith(", with changes")
