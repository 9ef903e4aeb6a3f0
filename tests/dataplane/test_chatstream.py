"""A chat completion reply read as events, from a stream cut anywhere or a whole body."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from luftpause.dataplane.chatstream import (
    Begin,
    CallArgs,
    CallStart,
    ChatReader,
    Done,
    Event,
    Failed,
    Finish,
    Reasoning,
    Text,
    Used,
    completion_events,
)
from luftpause.dataplane.reply import Usage
from tests.dataplane.fakes import TEXT_STREAM, TOOL_STREAM, delta_chunk, sse


def read_all(data: bytes, cuts: list[int] | None = None) -> tuple[ChatReader, list[Event]]:
    reader = ChatReader()
    bounds = [0, *sorted({c for c in cuts or [] if 0 < c < len(data)}), len(data)]
    events = [e for a, b in itertools.pairwise(bounds) for e in reader.feed(data[a:b])]
    return reader, events + reader.flush()


def test_a_text_stream_reads_as_begin_text_finish_usage_and_done() -> None:
    reader, events = read_all(b"".join(TEXT_STREAM))
    assert events == [
        Begin("chatcmpl-1", "sim-model", 1),
        Text("Hello"),
        Text(" world"),
        Finish("stop"),
        Used(Usage(prompt_tokens=12, completion_tokens=2, cached_tokens=8)),
        Done(),
    ]
    summary = reader.summary()
    assert reader.first_token and summary.finish_reason == "stop" and not summary.tool_calls


def test_a_tool_call_starts_once_with_its_id_and_name_then_streams_its_arguments() -> None:
    reader, events = read_all(b"".join(TOOL_STREAM))
    assert events[1:4] == [
        CallStart(0, "call_abc", "lookup"),
        CallArgs(0, '{"q": "x"}'),
        Finish("tool_calls"),
    ]
    assert reader.summary().tool_call_ids == ("call_abc",)
    assert reader.summary().tool_calls


@given(st.lists(st.integers(min_value=0, max_value=2000), max_size=25))
def test_the_events_are_the_same_however_the_bytes_are_cut(cuts: list[int]) -> None:
    data = b"".join(TOOL_STREAM + TEXT_STREAM[1:])
    assert read_all(data, cuts)[1] == read_all(data)[1]


def test_reasoning_comes_before_content_and_counts_as_the_first_token() -> None:
    data = b"".join(
        sse(
            delta_chunk({"role": "assistant", "content": ""}),
            delta_chunk({"reasoning_content": "think"}),
            delta_chunk({"content": "ok"}, "stop"),
        )
    )
    cut = data.index(b"\n\n", data.index(b"think")) + 2
    reader = ChatReader()
    assert Reasoning("think") in reader.feed(data[:cut]) and reader.first_token
    assert Text("ok") in reader.feed(data[cut:])


def test_an_error_chunk_mid_stream_is_a_failure() -> None:
    data = b"".join(TEXT_STREAM[:2]) + b'data: {"error": {"message": "engine out of memory"}}\n\n'
    _, events = read_all(data)
    assert events[-1] == Failed("engine out of memory")


def test_parallel_calls_keep_their_own_indexes() -> None:
    calls = [
        {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}},
        {"index": 1, "id": "b", "function": {"name": "g", "arguments": ""}},
    ]
    data = b"".join(
        sse(
            delta_chunk({"tool_calls": calls}),
            delta_chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"x":1}'}}]}),
        )
    )
    reader, events = read_all(data)
    assert [e for e in events if isinstance(e, CallStart | CallArgs)] == [
        CallStart(0, "a", "f"),
        CallArgs(0, "{}"),
        CallStart(1, "b", "g"),
        CallArgs(1, '{"x":1}'),
    ]
    assert reader.summary().tool_call_ids == ("a", "b")


def test_a_whole_completion_gives_the_events_its_stream_would() -> None:
    body = {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "created": 5,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Let me look.",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    }
    events, summary = completion_events(json.dumps(body).encode())
    assert events == [
        Begin("chatcmpl-9", "m", 5),
        Text("Let me look."),
        CallStart(0, "c1", "f"),
        CallArgs(0, "{}"),
        Finish("tool_calls"),
        Used(Usage(prompt_tokens=9, completion_tokens=3)),
    ]
    assert summary.tool_call_ids == ("c1",) and summary.finish_reason == "tool_calls"
