"""bench.rereads: continuation turns that re-read their context, counted from llama.cpp logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.rereads import cached, per_arm, reach, rereads, segments


def _turn(task: int, prompt: int, evaluated: int, generated: int) -> str:
    return (
        f"I slot print_timing: id  0 | task {task} | prompt eval time = 1.0 ms / "
        f"{evaluated} tokens\n"
        f"I slot print_timing: id  0 | task {task} |        eval time = 1.0 ms / "
        f"{generated} tokens\n"
        f"I slot      release: id  0 | task {task} | stop processing: n_tokens = "
        f"{prompt + generated}, truncated = 0\n"
    )


LOG = (
    "I srv    load_model: loading model 'm.gguf'\n"
    + _turn(1, 1040, 1040, 40)  # a first turn: all its prompt is new
    + _turn(2, 1038, 700, 12)  # another first turn, preamble cached
    + _turn(3, 1100, 60, 40)  # a continuation that found its context
    + _turn(4, 1160, 800, 40)  # a continuation that re-read it
    + "I srv    load_model: loading model 'm.gguf'\n"
    + _turn(1, 1040, 1040, 40)
)


def test_segments_split_at_each_engine_start_and_give_prompt_and_evaluated_tokens() -> None:
    assert segments(LOG) == [
        [(1040, 1040), (1038, 700), (1100, 60), (1160, 800)],
        [(1040, 1040)],
    ]


def test_only_continuations_that_evaluated_over_half_their_prompt_count_as_rereads() -> None:
    first, second = segments(LOG)
    assert rereads(first) == (1, 2)
    assert rereads(second) == (0, 0)
    assert rereads([]) == (0, 0)


def test_the_cached_share_counts_every_prompt_token_not_evaluated() -> None:
    first, second = segments(LOG)
    assert cached(first) == (1040 + 1038 + 1100 + 1160, 338 + 1040 + 360)
    assert cached(second) == (1040, 0)


def test_what_placement_could_win_counts_first_turns_and_rereads_as_typical() -> None:
    first, second = segments(LOG)
    # First turns evaluated 1040 + 700; the re-read continuation counts as the other's 60.
    assert reach(first) == (1740, 4338 - (1040 + 700 + 60 + 60))
    assert reach(second) == (1040, 0)
    assert reach([]) == (0, 0)


START = "I srv    load_model: loading model 'm.gguf'\n"
# Arm a's runs re-read their context, arm b's find it: each segment says whose it is.
SEGMENT = {
    "a": START + _turn(1, 1040, 1040, 40) + _turn(2, 1160, 800, 40),
    "b": START + _turn(1, 1040, 1040, 40) + _turn(2, 1100, 60, 40),
}


def test_each_segment_goes_to_the_arm_the_repeats_rotated_order_ran_there(tmp_path: Path) -> None:
    orders = [["a", "b"], ["b", "a"]]
    (tmp_path / "engine-0.log").write_text("".join(SEGMENT[arm] for o in orders for arm in o))
    counts = per_arm(tmp_path, ["a", "b"], orders)
    assert [rep[:2] for rep in counts["a"]] == [[1, 1], [1, 1]]
    assert [rep[:2] for rep in counts["b"]] == [[0, 1], [0, 1]]
    # A result from before the rotation: every repeat in the arms' order.
    unrotated = per_arm(tmp_path, ["a", "b"])
    assert [rep[:2] for rep in unrotated["a"]] == [[1, 1], [0, 1]]


def test_a_log_with_more_repeats_than_the_result_ran_is_refused(tmp_path: Path) -> None:
    (tmp_path / "engine-0.log").write_text(SEGMENT["a"] + SEGMENT["b"] * 3)
    with pytest.raises(SystemExit, match="4 engine starts, over 1 repeats"):
        per_arm(tmp_path, ["a", "b"], [["a", "b"]])
