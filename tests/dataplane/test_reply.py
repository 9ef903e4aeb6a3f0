"""A non-stream reply is summarised once: usage, finish reason, tool call ids."""

from __future__ import annotations

import json

import pytest

from luftpause.dataplane.reply import ReplySummary, Usage, summarize_completion


def completion(message: dict[str, object], finish_reason: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 3, "cached_tokens": 4},
        }
    ).encode()


def test_tool_call_reply_gives_ids_and_pauses() -> None:
    body = completion(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f"}}],
        },
        "tool_calls",
    )
    summary = summarize_completion(body)
    assert summary == ReplySummary(
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=9, completion_tokens=3, cached_tokens=4),
        tool_call_ids=("call_1",),
        tool_calls=True,
    )


def test_plain_answer_does_not_pause() -> None:
    summary = summarize_completion(completion({"role": "assistant", "content": "hi"}, "stop"))
    assert summary.finish_reason == "stop" and not summary.tool_calls


def test_finish_reason_tool_calls_alone_pauses_the_run() -> None:
    summary = summarize_completion(completion({"role": "assistant", "content": ""}, "tool_calls"))
    assert summary.tool_calls and summary.tool_call_ids == ()


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b'{"choices": "x"}'])
def test_unreadable_body_gives_an_empty_summary(body: bytes) -> None:
    assert summarize_completion(body) == ReplySummary()


def test_summary_refuses_ids_without_tool_calls() -> None:
    with pytest.raises(ValueError):
        ReplySummary(tool_call_ids=("x",), tool_calls=False)
