"""Replies of the Messages and Responses APIs relayed unchanged, read for the turn's facts.

The native streams here are the translators' own output, so each test also says that a reply
read on the way through gives the scheduler the facts the chat reply it came from would have.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from luftpause.dataplane.chatstream import ChatReader, Translation, translate_body
from luftpause.dataplane.doors import Observer
from luftpause.dataplane.messages.observe import MessagesObserver, summarize_message
from luftpause.dataplane.messages.reply import MessagesWriter
from luftpause.dataplane.reply import ReplySummary
from luftpause.dataplane.responses.observe import ResponsesObserver, summarize_response
from luftpause.dataplane.responses.reply import ResponsesWriter
from luftpause.dataplane.responses.request import ToolNames
from tests.dataplane.fakes import TEXT_STREAM, TOOL_STREAM, delta_chunk, sse

LENGTH_STREAM = sse(delta_chunk({"content": "cut"}), delta_chunk({}, "length"))
STREAMS = {"text": TEXT_STREAM, "tool": TOOL_STREAM, "length": LENGTH_STREAM}
WRITERS = {
    "messages": (lambda s: MessagesWriter("m", stream=s), MessagesObserver),
    "responses": (
        lambda s: ResponsesWriter({"model": "m"}, ToolNames(), stream=s),
        ResponsesObserver,
    ),
}


def chat_summary(chunks: list[bytes]) -> ReplySummary:
    reader = ChatReader()
    for chunk in chunks:
        reader.feed(chunk)
    reader.flush()
    return reader.summary()


def observe(observer: Observer, data: bytes, cuts: list[int]) -> list[int]:
    """Feed `data` cut at `cuts`; the indexes of the pieces that carried the first token."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    hits = [i for i, (a, b) in enumerate(itertools.pairwise(bounds)) if observer.feed(data[a:b])]
    if observer.flush():
        hits.append(len(bounds))
    return hits


@pytest.mark.parametrize("api", sorted(WRITERS))
@pytest.mark.parametrize("reply", sorted(STREAMS))
def test_a_native_stream_tells_what_its_chat_stream_told(api: str, reply: str) -> None:
    writer, observer_of = WRITERS[api]
    translation = Translation(writer(True))
    native = b"".join(translation.feed(c) for c in STREAMS[reply]) + translation.flush()
    observer = observer_of()
    assert len(observe(observer, native, [])) == 1
    assert observer.summary() == chat_summary(STREAMS[reply])


@pytest.mark.parametrize("api", sorted(WRITERS))
@given(cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=20))
def test_the_first_token_is_seen_once_however_the_stream_is_cut(api: str, cuts: list[int]) -> None:
    writer, observer_of = WRITERS[api]
    translation = Translation(writer(True))
    native = b"".join(translation.feed(c) for c in TOOL_STREAM) + translation.flush()
    observer = observer_of()
    assert len(observe(observer, native, cuts)) == 1
    assert observer.summary() == chat_summary(TOOL_STREAM)


@pytest.mark.parametrize(
    ("api", "summarize"), [("messages", summarize_message), ("responses", summarize_response)]
)
def test_a_whole_native_reply_tells_what_its_chat_completion_told(
    api: str, summarize: object
) -> None:
    body = {
        "id": "chatcmpl-1",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
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
        "usage": {
            "prompt_tokens": 9,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
    native, summary = translate_body(json.dumps(body).encode(), WRITERS[api][0](False))
    assert callable(summarize)
    assert summarize(native) == summary
    assert summary.tool_call_ids == ("c1",) and summary.usage is not None
    assert summary.usage.cached_tokens == 4


def test_an_anthropic_stream_counts_cache_reads_and_writes_into_the_prompt() -> None:
    start = {
        "type": "message_start",
        "message": {
            "usage": {
                "input_tokens": 3,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 20,
                "output_tokens": 1,
            }
        },
    }
    stream = (
        f"event: message_start\ndata: {json.dumps(start)}\n\n"
        "event: ping\ndata: {}\n\n"
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        '"content_block":{"type":"text","text":""}}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        '"delta":{"type":"text_delta","text":"Hi"}}\n\n'
        'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
        '"usage":{"output_tokens":7}}\n\n'
    ).encode()
    observer = MessagesObserver()
    assert observer.feed(stream)
    summary = observer.summary()
    assert summary.finish_reason == "stop" and summary.usage is not None
    assert (summary.usage.prompt_tokens, summary.usage.cached_tokens) == (123, 100)
    assert summary.usage.completion_tokens == 7
