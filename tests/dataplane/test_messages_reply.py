"""Chat replies written as Messages API replies, checked against the `anthropic` SDK's types."""

from __future__ import annotations

import itertools
import json
from typing import Any

from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from luftpause.dataplane.chatstream import Translation, translate_body
from luftpause.dataplane.messages.reply import MessagesWriter
from tests.dataplane.fakes import TEXT_STREAM, TOOL_STREAM, delta_chunk, sse, usage_chunk

EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)


def translate(data: bytes, cuts: list[int] | None = None) -> bytes:
    stream = Translation(MessagesWriter("claude-local"))
    bounds = [0, *sorted({c for c in cuts or [] if 0 < c < len(data)}), len(data)]
    return b"".join(stream.feed(data[a:b]) for a, b in itertools.pairwise(bounds)) + stream.flush()


def events_of(out: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) per server-sent event, each checked against the SDK's event types."""
    events = []
    for frame in out.decode().split("\n\n"):
        if not frame:
            continue
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        doc = json.loads(data[6:])
        assert doc["type"] == name[7:]
        if doc["type"] != "error":  # the SDK raises on an error event rather than parse it
            EVENTS.validate_python(doc)
        events.append((name[7:], doc))
    return events


def test_a_text_stream_becomes_a_message_with_one_text_block() -> None:
    events = events_of(translate(b"".join(TEXT_STREAM)))
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["id"] == "msg_1" and start["model"] == "claude-local" and start["content"] == []
    assert [e["delta"]["text"] for n, e in events if n == "content_block_delta"] == [
        "Hello",
        " world",
    ]
    delta = events[5][1]
    assert delta["delta"]["stop_reason"] == "end_turn"
    # 12 prompt tokens of which 8 came from the engine's cache: Anthropic counts them apart.
    assert delta["usage"] == {
        "input_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 8,
        "output_tokens": 2,
    }


def test_a_tool_call_becomes_a_tool_use_block_with_its_input_streamed_as_json() -> None:
    events = events_of(translate(b"".join(TOOL_STREAM)))
    starts = [e["content_block"] for n, e in events if n == "content_block_start"]
    assert starts == [{"type": "tool_use", "id": "call_abc", "name": "lookup", "input": {}}]
    parts = [e["delta"]["partial_json"] for n, e in events if n == "content_block_delta"]
    assert json.loads("".join(parts)) == {"q": "x"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


@given(st.lists(st.integers(min_value=0, max_value=3000), max_size=25))
def test_the_client_gets_the_same_bytes_however_the_engine_cuts_its_stream(
    cuts: list[int],
) -> None:
    data = b"".join(TOOL_STREAM)
    assert translate(data, cuts) == translate(data)


def test_text_then_parallel_calls_each_get_their_own_block_in_order() -> None:
    data = b"".join(
        sse(
            delta_chunk({"role": "assistant", "content": "I'll check."}),
            delta_chunk(
                {
                    "tool_calls": [
                        {"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}
                    ]
                }
            ),
            delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"n":1}'}}]}),
            delta_chunk(
                {
                    "tool_calls": [
                        {"index": 1, "id": "b", "function": {"name": "f", "arguments": ""}}
                    ]
                }
            ),
            delta_chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"n":2}'}}]}),
            delta_chunk({}, "tool_calls"),
            usage_chunk(30, 20, 0),
        )
    )
    events = events_of(translate(data))
    blocks = [
        (e["index"], e["content_block"]["type"]) for n, e in events if n == "content_block_start"
    ]
    assert blocks == [(0, "text"), (1, "tool_use"), (2, "tool_use")]
    stops = [e["index"] for n, e in events if n == "content_block_stop"]
    assert stops == [0, 1, 2]


def test_a_length_cut_is_max_tokens_and_reasoning_a_thinking_block() -> None:
    data = b"".join(
        sse(
            delta_chunk({"reasoning_content": "Let me think"}),
            delta_chunk({"content": "The ans"}),
            delta_chunk({}, "length"),
        )
    )
    events = events_of(translate(data))
    kinds = [e["content_block"]["type"] for n, e in events if n == "content_block_start"]
    assert kinds == ["thinking", "text"]
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"


def test_an_engine_error_mid_stream_ends_with_an_error_event_and_no_message_stop() -> None:
    data = b"".join(TEXT_STREAM[:2]) + b'data: {"error": {"message": "out of memory"}}\n\n'
    events = events_of(translate(data))
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "out of memory"}},
    )
    assert "message_stop" not in [name for name, _ in events]


def test_a_whole_completion_becomes_a_message_the_sdk_reads() -> None:
    body = {
        "id": "chatcmpl-7",
        "object": "chat.completion",
        "created": 1,
        "model": "engine-model",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Looking.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": '{"q": "Loire"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 50,
            "completion_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 40},
        },
    }
    data, summary = translate_body(
        json.dumps(body).encode(), MessagesWriter("claude-local", stream=False)
    )
    message = Message.model_validate_json(data)
    assert message.model == "claude-local" and message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["text", "tool_use"]
    call = message.content[1]
    assert call.type == "tool_use"
    assert (call.id, call.name, call.input) == ("call_1", "lookup", {"q": "Loire"})
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (10, 40)
    assert summary.tool_call_ids == ("call_1",)
