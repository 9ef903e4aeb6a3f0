"""The pure part of the sub-agent load: records from the runtime's answers, and the summary."""

from __future__ import annotations

import pytest

from luftpause.testkit.mcp_loadgen import (
    McpRun,
    McpWorkload,
    prompt_tokens,
    record,
    summarise,
)
from luftpause.testkit.stats import percentile


def _run(cls: str = "batch", caller: str = "caller-0", **kw: object) -> McpRun:
    fields: dict[str, object] = {
        "handle": "h",
        "service_class": cls,
        "caller": caller,
        "started": 0.0,
        "ended": 10.0,
        "state": "finished",
        **kw,
    }
    return McpRun(**fields)  # type: ignore[arg-type]


def test_a_record_takes_state_turns_and_tool_calls_from_awaits_entry() -> None:
    entry = {
        "handle": "run-1",
        "state": "finished",
        "result": "done",
        "toolCalls": 3,
        "failedToolCalls": 1,
        "turns": 4,
    }
    run = record(entry, service_class="batch", caller="caller-2", started=1.0, ended=5.0)
    assert (run.handle, run.state, run.turns, run.tool_calls) == ("run-1", "finished", 4, 3)
    assert run.failed_tool_calls == 1 and run.error is None and run.finished


def test_a_failed_call_is_a_run_in_state_error_with_the_message() -> None:
    run = record(
        None, service_class="interactive", caller="c", started=1.0, ended=2.0, error="boom"
    )
    assert run.state == "error" and run.error == "boom" and run.failed and run.handle is None


def test_a_failed_run_carries_the_runtimes_error() -> None:
    entry = {"handle": "h", "state": "failed", "turns": 1, "toolCalls": 0, "error": "TurnError"}
    run = record(entry, service_class="batch", caller="c", started=0.0, ended=1.0)
    assert run.failed and run.error == "TurnError"


def test_a_run_still_going_at_the_window_end_is_neither_finished_nor_failed() -> None:
    run = _run(state="running")
    assert not run.finished and not run.failed


def test_a_run_cannot_end_before_it_starts() -> None:
    with pytest.raises(ValueError, match="end before"):
        _run(started=5.0, ended=4.0)


def test_a_workload_needs_a_caller_and_a_window() -> None:
    with pytest.raises(ValueError, match="callers"):
        McpWorkload(
            url="u", interactive=1, batch=1, context_chars=1, tool_calls=1, window_s=1, seed=1,
            callers=0,
        )  # fmt: skip


def test_percentile_is_by_rank_and_none_when_empty() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(100)], 0.99) == 99.0


def test_prompt_tokens_walks_the_status_tree_children_included() -> None:
    status = {
        "tree": [
            {
                "handle": "a",
                "own": {"promptTokens": 10, "cachedPromptTokens": 4},
                "children": [{"handle": "b", "own": {"promptTokens": 5}, "children": []}],
            },
            {"handle": "c", "own": {"promptTokens": 7, "cachedPromptTokens": 7}, "children": []},
        ]
    }
    assert prompt_tokens(status) == {"a": (10, 4), "b": (5, 0), "c": (7, 7)}


def test_summary_counts_only_runs_finished_inside_the_span() -> None:
    runs = [
        _run(ended=10.0),
        _run(ended=20.0),
        _run(ended=70.0),  # after the span
        _run(state="running", ended=60.0),
    ]
    s = summarise(runs, 60.0)["batch"]
    assert s["runs_per_min"] == 2.0
    assert s["runs_finished"] == 2 and s["runs_unfinished"] == 1
    assert s["run_time_p50_s"] == 20.0 and s["errors"] == 0


def test_summary_keeps_loadgens_keys_and_leaves_what_the_runtime_hides_as_none() -> None:
    run = _run(cls="interactive", turns=4, tool_calls=3, prompt_tokens=100, cached_tokens=25)
    s = summarise([run], 60.0)
    inter = s["interactive"]
    for key in ("ttft_p50_s", "ttft_p99_s", "runs_moved"):
        assert inter[key] is None
    assert inter["cached_share"] == 0.25
    assert inter["prompt_tokens"] == 100 and inter["cached_tokens"] == 25
    assert inter["turns_per_run"] == 4 and inter["tool_calls_per_run"] == 3
    assert inter["prompt_tokens_per_run"] == 100
    assert s["batch"]["runs_per_min"] == 0.0 and s["batch"]["jain_callers"] is None


def test_jain_counts_a_caller_whose_runs_never_finished_as_zero() -> None:
    runs = [_run(caller="caller-0"), _run(caller="caller-1", state="running")]
    assert summarise(runs, 60.0)["batch"]["jain_callers"] == 0.5


def test_errors_count_failed_runs_and_failed_calls_per_class() -> None:
    runs = [
        _run(state="failed", error="x"),
        _run(state="error", handle=None, error="spawn: boom"),
        _run(cls="interactive"),
    ]
    s = summarise(runs, 60.0)
    assert s["batch"]["errors"] == 2 and s["interactive"]["errors"] == 0
