"""The context wall's pure core (`compaction`), the state machine's `Compacted` event and the
`compacted` journal record. No event loop."""

from __future__ import annotations

import json
from typing import Any

import pytest

from luftpause.runtime.core import compaction as c
from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m

SPEC = m.RunSpec(handle="run-1", task="find the rivers", model="sim", system="be exact")
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {"name": "lookup"}}]


def call(n: int) -> m.ToolCall:
    return m.ToolCall(id=f"c{n}", name="lookup", arguments=json.dumps({"query": f"q{n}"}))


def with_rounds(n: int, *, text: str = "result", spec: m.RunSpec = SPEC) -> m.RunState:
    """A run after `n` complete tool rounds, each result `text` plus its number."""
    state = m.start(spec)
    for i in range(1, n + 1):
        state, _ = m.step(state, m.TurnCompleted(content=None, tool_calls=(call(i),)))
        result = m.ToolResult(call_id=f"c{i}", name="lookup", content=f"{text} {i}")
        state, _ = m.step(state, m.ToolsReturned(results=(result,)))
    return state


def contents(messages: tuple[dict[str, Any], ...]) -> list[str]:
    return [str(x.get("content")) for x in messages]


# --- the history's parts ---


def test_a_history_splits_into_head_bridge_and_numbered_rounds() -> None:
    state = with_rounds(3)
    h = c.split(state.messages, head=2, rounds=3)
    assert [x["role"] for x in h.head] == ["system", "user"] and h.bridge == ()
    assert (h.first, h.last, len(h.rounds)) == (1, 3, 3)
    assert [[x["role"] for x in r] for r in h.rounds] == [["assistant", "tool"]] * 3


def test_a_summary_replaces_the_oldest_rounds_and_keeps_system_task_and_last_rounds() -> None:
    state = with_rounds(4)
    out = c.replaced(state.messages, head=2, rounds=4, through=2, summary="rivers: Loire 1006 km")
    assert out[:2] == state.messages[:2]
    assert out[2]["role"] == "user" and "rounds 1-2" in out[2]["content"]
    assert out[2]["content"].endswith("rivers: Loire 1006 km")
    assert out[3:] == state.messages[-4:]


def test_a_second_compaction_replaces_the_first_summary_too() -> None:
    state = with_rounds(4)
    once = c.replaced(state.messages, head=2, rounds=4, through=2, summary="first")
    twice = c.replaced(once, head=2, rounds=4, through=3, summary="second")
    h = c.split(twice, head=2, rounds=4)
    assert [x["content"] for x in h.bridge] == [c.bridge(3, "second")["content"]]
    assert (h.first, h.last) == (4, 4)


def test_truncation_leaves_a_note_that_the_rounds_are_gone() -> None:
    out = c.replaced(with_rounds(3).messages, head=2, rounds=3, through=1, summary=None)
    assert "dropped" in out[2]["content"] and "1-1" in out[2]["content"]


@pytest.mark.parametrize("through", [0, 4])
def test_only_verbatim_rounds_can_be_replaced(through: int) -> None:
    with pytest.raises(ValueError, match="verbatim"):
        c.replaced(with_rounds(3).messages, head=2, rounds=3, through=through, summary="s")


# --- estimates ---


def test_the_estimate_is_the_last_report_plus_what_came_after_its_reply() -> None:
    state = with_rounds(2)
    sent = state.messages[:-2]  # the turn that asked for round 2's call
    reported = c.Reported(prompt_tokens=500, completion_tokens=20, sent=sent)
    added = c.message_tokens(state.messages[-1])
    assert c.estimate(state.messages, TOOLS, reported) == 500 + 20 + added


def test_without_a_report_or_after_the_history_changed_the_estimate_is_by_bytes() -> None:
    state = with_rounds(2)
    by_bytes = c.text_tokens(state.messages, TOOLS)
    assert c.estimate(state.messages, TOOLS) == by_bytes
    stale = c.Reported(prompt_tokens=500, completion_tokens=20, sent=({"role": "user"},))
    assert c.estimate(state.messages, TOOLS, stale) == by_bytes
    assert by_bytes > len(json.dumps(TOOLS)) // c.BYTES_PER_TOKEN


def test_a_turn_fits_when_prompt_plus_reply_is_at_most_the_window() -> None:
    assert c.fits(900, 100, 1000) and not c.fits(901, 100, 1000) and c.fits(10**9, 1, None)


# --- the plan ---


def test_the_plan_summarises_all_but_the_last_k_rounds_with_the_history_as_prefix() -> None:
    state = with_rounds(6)
    h = c.split(state.messages, head=2, rounds=6)
    plan = c.plan(h, TOOLS, window=100_000, keep=2)
    assert plan is not None and plan.through == 4 and plan.request is not None
    # The run's own messages up to round 4 come first (the engine's cache serves them)...
    assert plan.request[:-1] == state.messages[: 2 + 2 * 4]
    # ...then the instruction to keep every fact.
    assert plan.request[-1] == {"role": "user", "content": c.SUMMARY_INSTRUCTION}
    for fact in ("names", "numbers", "decisions", "open questions"):
        assert fact in c.SUMMARY_INSTRUCTION


def test_at_least_one_round_goes_even_when_there_are_no_more_than_k() -> None:
    h = c.split(with_rounds(2).messages, head=2, rounds=2)
    plan = c.plan(h, TOOLS, window=None, keep=4)
    assert plan is not None and plan.through == 1


def test_no_plan_without_a_round_to_replace() -> None:
    h = c.split(m.start(SPEC).messages, head=2, rounds=0)
    assert c.plan(h, TOOLS, window=1000, keep=2) is None
    assert c.truncation(h, TOOLS, window=1000, reserve=10, keep=2) is None


def test_a_summary_request_that_would_not_fit_is_not_made() -> None:
    h = c.split(with_rounds(6, text="word " * 100).messages, head=2, rounds=6)
    plan = c.plan(h, TOOLS, window=200, keep=1)
    assert plan is not None and plan.request is None and plan.through == 5
    assert plan.summary_tokens == 50  # a quarter of the window at most


def test_truncation_keeps_as_many_of_the_last_rounds_as_fit() -> None:
    state = with_rounds(6, text="word " * 40)
    h = c.split(state.messages, head=2, rounds=6)
    round_tokens = sum(c.message_tokens(x) for x in h.rounds[0])
    head = c.text_tokens((*h.head, c.bridge(6, None)), TOOLS)
    window = head + 2 * round_tokens + 50
    through = c.truncation(h, TOOLS, window=window, reserve=50, keep=1)
    assert through == 4  # rounds 5 and 6 fit, with the reply's reserve
    assert c.truncation(h, TOOLS, window=None, reserve=50, keep=1) == 5
    assert c.truncation(h, TOOLS, window=10, reserve=50, keep=1) == 6  # nothing fits


# --- what engines say ---


OPENAI = {
    "error": {
        "message": "This model's maximum context length is 4096 tokens. However, you requested "
        "5000 tokens (4744 in the messages, 256 in the completion).",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
VLLM = {
    "object": "error",
    "message": "This model's maximum context length is 2048 tokens. However, your request has "
    "3000 input tokens.",
    "type": "BadRequestError",
    "code": 400,
}
LLAMA_CPP = {
    "error": {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 9000,
        "n_ctx": 8192,
    }
}
SGLANG = {
    "message": "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
}


@pytest.mark.parametrize(
    ("body", "window"),
    [(OPENAI, 4096), (OPENAI["error"], 4096), (VLLM, 2048), (LLAMA_CPP, 8192), (SGLANG, 4096)],
    ids=["openai", "openai-inner", "vllm", "llama.cpp", "sglang"],
)
def test_an_engines_refusal_of_a_long_prompt_is_recognised_with_its_window(
    body: dict[str, Any], window: int
) -> None:
    assert c.overflow(400, body) == (True, window)


def test_other_errors_are_not_a_context_overflow() -> None:
    assert c.overflow(400, {"error": {"message": "'messages' is required"}}) == (False, None)
    assert c.overflow(500, OPENAI) == (False, None)
    overflow = {"error": {"code": "context_length_exceeded", "message": "too long"}}
    assert c.overflow(400, overflow) == (True, None)


@pytest.mark.parametrize(
    ("entry", "window"),
    [
        ({"id": "m", "max_model_len": 32768}, 32768),
        ({"id": "m", "context_length": 8192}, 8192),
        ({"id": "m", "meta": {"n_ctx_train": 131072}}, 131072),
        ({"id": "m", "owned_by": "x"}, None),
        ({"id": "m", "max_model_len": True}, None),
    ],
)
def test_a_models_entry_gives_its_context_window(entry: dict[str, Any], window: int | None) -> None:
    assert c.model_window(entry) == window


# --- the state machine and the journal ---


def compacted(state: m.RunState, through: int, summary: str | None) -> m.RunState:
    event = m.Compacted(
        through=through, summary=summary, usage=m.Usage(prompt_tokens=70, completion_tokens=9)
    )
    new, [record] = m.step(state, event)
    assert isinstance(record, m.RecordCompacted)
    return new


def test_a_compaction_replaces_the_history_and_counts_the_summarys_tokens() -> None:
    state = with_rounds(5)
    new = compacted(state, 3, "notes")
    assert new.messages[:2] == state.messages[:2] and new.messages[3:] == state.messages[-4:]
    assert new.rounds == 5 and new.tool_calls == 5 and new.phase is m.Phase.RUNNING
    assert new.usage.prompt_tokens == state.usage.prompt_tokens + 70
    assert new.usage.turns == state.usage.turns


def test_a_history_is_compacted_only_between_turns() -> None:
    state, _ = m.step(with_rounds(2), m.TurnCompleted(content=None, tool_calls=(call(3),)))
    with pytest.raises(ValueError, match="compacted while the run is tools"):
        m.step(state, m.Compacted(through=1, summary="s"))


def journaled(n: int, *then: m.Event) -> tuple[m.RunState, list[dict[str, Any]]]:
    """A run of `n` tool rounds, then `then`: its state and its journal."""
    state = m.start(SPEC)
    records = [j.spawned_record(SPEC)]
    events: list[m.Event] = []
    for i in range(1, n + 1):
        result = m.ToolResult(call_id=f"c{i}", name="lookup", content=f"result {i}")
        events += [
            m.TurnCompleted(content=None, tool_calls=(call(i),)),
            m.ToolsReturned(results=(result,)),
        ]
    for event in (*events, *then):
        state, decisions = m.step(state, event)
        records += [r for d in decisions if (r := j.record_of("run-1", d)) is not None]
    return state, records


def test_replay_of_a_compacted_record_restores_the_compacted_history() -> None:
    usage = m.Usage(prompt_tokens=70, completion_tokens=9)
    event = m.Compacted(through=2, summary="notes", usage=usage, window=1000, estimate=1200)
    state, records = journaled(4, event)
    [record] = [r for r in records if r["type"] == "compacted"]
    assert record["rounds"] == [1, 2] and record["summary"] == "notes"
    assert record["window"] == 1000 and record["estimate"] == 1200
    assert record["usage"]["promptTokens"] == 70
    replayed = j.replay(records)
    assert replayed.ignored == 0 and replayed.runs["run-1"] == state
    assert "rounds 1-2" in replayed.runs["run-1"].messages[2]["content"]


def test_a_truncation_replays_as_dropped_rounds() -> None:
    state, records = journaled(3, m.Compacted(through=2, summary=None))
    assert [r["summary"] for r in records if r["type"] == "compacted"] == [None]
    assert j.replay(records).runs["run-1"] == state


def test_a_compacted_record_that_does_not_fit_the_run_is_ignored() -> None:
    _, records = journaled(3, m.Compacted(through=2, summary="s"))
    again = [r for r in records if r["type"] == "compacted"]  # rounds 1-2 are gone by then
    beyond = {**again[0], "rounds": [3, 7]}
    replayed = j.replay([*records, *again, beyond])
    assert replayed.ignored == 2
