"""The turn client: its Retry-After parsing (no network); against a real server on loopback, what
a reply becomes (content, tool calls, usage), how each kind of failure is retried or not, the
models it lists, and the engine priority a turn's body carries with --send-priority."""

from __future__ import annotations

from typing import Any

import pytest

from luftpause.runtime.core.errors import ContextOverflow, TurnError
from luftpause.runtime.core.machine import ToolCall
from luftpause.runtime.core.values import RunSpec
from luftpause.runtime.loop import llm as llm_module
from luftpause.runtime.loop.llm import DEFAULT_RETRY_AFTER, Llm, retry_after
from luftpause.runtime.main import parse_args
from tests.runtime.loopback import plane


def test_retry_after_in_seconds_is_used_and_anything_else_falls_back_to_one_second() -> None:
    assert retry_after({"retry-after": "2.5"}) == 2.5
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == DEFAULT_RETRY_AFTER
    assert retry_after({}) == DEFAULT_RETRY_AFTER == 1.0
    assert retry_after(None) == DEFAULT_RETRY_AFTER


SPEC = RunSpec(handle="run-1", task="t", model="sim", service_class="interactive")
HI = ({"role": "user", "content": "hi"},)
LOOKUP = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def _completion(message: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "c9",
        "object": "chat.completion",
        "model": "sim",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        **({"usage": usage} if usage is not None else {}),
    }


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_module, "BACKOFF", 0.01)
    monkeypatch.setattr(llm_module, "DEFAULT_RETRY_AFTER", 0.01)


async def test_a_reply_gives_its_tool_calls_and_its_usage_with_cached_tokens() -> None:
    calls = [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"q":1}'},
        },
        {"type": "function", "function": {"name": "lookup", "arguments": ""}},
    ]
    usage = {
        "prompt_tokens": 40,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    async with plane() as fake:
        fake.answers.append(
            (
                200,
                _completion({"role": "assistant", "content": None, "tool_calls": calls}, usage),
                {},
            )
        )
        llm = Llm(fake.url, timeout=10.0)
        try:
            turn = await llm.turn(SPEC, HI, LOOKUP)
            told_none = await llm.turn(SPEC, HI, LOOKUP, calls=False)
        finally:
            await llm.close()
    assert turn.tool_calls == (
        ToolCall(id="call_a", name="lookup", arguments='{"q":1}'),
        ToolCall(id="call_c9_1", name="lookup", arguments="{}"),  # no id given: one made
    )
    assert turn.content is None
    assert (turn.usage.prompt_tokens, turn.usage.cached_prompt_tokens) == (40, 32)
    assert turn.usage.completion_tokens == 7 and turn.usage.turns == 1
    assert fake.bodies[0]["tools"] == LOOKUP and "tool_choice" not in fake.bodies[0]
    assert fake.bodies[1]["tool_choice"] == "none"
    assert told_none.content == "done" and told_none.tool_calls == ()
    # as JSON, which a router in front of the engines may insist on (sglang-router does)
    assert fake.turns[0]["Content-Type"] == "application/json"
    assert fake.turns[0]["x-luftpause-run-id"] == "run-1"
    assert fake.turns[0]["x-luftpause-class"] == "interactive"


async def test_a_429_is_waited_out_and_server_errors_are_retried(quick_retries: None) -> None:
    async with plane() as fake:
        fake.answers += [
            (429, {"error": {"message": "slow down"}}, {"Retry-After": "0.05"}),
            (503, {"error": {"message": "no replica"}}, {}),
            (200, "not json", {}),
            (200, {"choices": []}, {}),
        ]
        llm = Llm(fake.url, timeout=10.0)
        try:
            turn = await llm.turn(SPEC, HI, [])
        finally:
            await llm.close()
    assert turn.content == "done"
    assert len(fake.bodies) == 5  # one refused, three failures (the most retried), one answer


async def test_the_fourth_failure_fails_the_turn_with_the_dataplanes_message(
    quick_retries: None,
) -> None:
    failed, tries = await _failing_turn([(500, {"error": {"message": "engine fell over"}}, {})] * 4)
    assert isinstance(failed, TurnError) and not isinstance(failed, ContextOverflow)
    assert str(failed) == "HTTP 500: engine fell over"
    assert tries == 4


async def _failing_turn(
    answers: list[tuple[int, Any, dict[str, str]]],
) -> tuple[TurnError, int]:
    """The error a turn fails with when the dataplane answers `answers`; how many it sent."""
    async with plane() as fake:
        fake.answers += answers
        llm = Llm(fake.url, timeout=10.0)
        try:
            with pytest.raises(TurnError) as failed:
                await llm.turn(SPEC, HI, [])
        finally:
            await llm.close()
    return failed.value, len(fake.bodies)


async def test_a_prompt_past_the_window_is_not_retried_and_names_the_window() -> None:
    refused = {
        "error": {
            "message": "the request exceeds the available context size",
            "type": "exceed_context_size_error",
            "n_ctx": 4096,
        }
    }
    overflow, tries = await _failing_turn([(400, refused, {})])
    assert isinstance(overflow, ContextOverflow) and overflow.window == 4096
    assert tries == 1


async def test_a_turn_that_cannot_finish_in_its_time_says_so(quick_retries: None) -> None:
    async with plane() as fake:
        fake.answers.append((429, {"error": {"message": "later"}}, {"Retry-After": "30"}))
        llm = Llm(fake.url, timeout=1.0)
        try:
            with pytest.raises(TurnError, match="did not finish within 1 s"):
                await llm.turn(SPEC, HI, [])
        finally:
            await llm.close()


async def test_models_lists_the_dataplanes_entries_and_refuses_what_is_not_a_list() -> None:
    async with plane() as fake:
        fake.models = [{"id": "sim", "max_model_len": 8192}, "junk"]  # type: ignore[list-item]
        llm = Llm(fake.url, timeout=10.0)
        try:
            assert await llm.models() == [{"id": "sim", "max_model_len": 8192}]
        finally:
            await llm.close()
    gone = Llm(fake.url, timeout=10.0)
    try:
        with pytest.raises(LookupError, match="ClientConnectorError"):
            await gone.models()
    finally:
        await gone.close()


# --send-priority: what a turn's body carries, seen by a real HTTP server on loopback.


async def _bodies_of_turns(priorities: dict[str, int], classes: list[str]) -> list[dict[str, Any]]:
    """The JSON bodies a real `Llm` sends for one turn of a run of each class in `classes`."""
    async with plane() as fake:
        llm = Llm(fake.url, timeout=10.0, priorities=priorities)
        try:
            for i, cls in enumerate(classes):
                spec = RunSpec(handle=f"run-{i}", task="t", model="sim", service_class=cls)
                turn = await llm.turn(spec, ({"role": "user", "content": "hi"},), [])
                assert turn.content == "done"
        finally:
            await llm.close()
        return fake.bodies


async def test_a_turn_carries_the_priority_of_its_runs_class_only_when_told() -> None:
    told = await _bodies_of_turns({"interactive": 0, "batch": 100}, ["interactive", "batch"])
    assert [b.get("priority") for b in told] == [0, 100]
    only_batch = await _bodies_of_turns({"batch": 7}, ["interactive", "batch"])
    assert ["priority" in b for b in only_batch] == [False, True]
    assert only_batch[1]["priority"] == 7
    untold = await _bodies_of_turns({}, ["interactive", "batch"])
    assert all("priority" not in b for b in untold)


def test_send_priority_parses_class_and_number_and_refuses_anything_else(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = parse_args(["--send-priority", "interactive=0", "--send-priority", "batch=100"], {})
    assert config.send_priority == (("interactive", 0), ("batch", 100))
    assert parse_args([], {"LUFTPAUSE_SEND_PRIORITY": "batch=5,interactive=1"}).send_priority == (
        ("batch", 5),
        ("interactive", 1),
    )
    for bad in ("urgent=1", "batch", "batch=high"):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(["--send-priority", bad], {})
        assert exit_info.value.code == 2
        assert "--send-priority" in capsys.readouterr().err
