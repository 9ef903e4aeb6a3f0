"""Chat replies written as Responses API replies, checked against the `openai` SDK's types."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from luftpause.dataplane.chatstream import Translation, translate_body
from luftpause.dataplane.responses.reply import ResponsesWriter
from luftpause.dataplane.responses.request import ToolName, ToolNames
from tests.dataplane.fakes import TEXT_STREAM, TOOL_STREAM, delta_chunk, sse, usage_chunk

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
REQUEST = {"model": "gpt-local", "input": "hi", "tools": [], "instructions": "Be brief."}


def translate(data: bytes, names: ToolNames | None = None, cuts: list[int] | None = None) -> bytes:
    stream = Translation(ResponsesWriter(REQUEST, names or ToolNames()))
    bounds = [0, *sorted({c for c in cuts or [] if 0 < c < len(data)}), len(data)]
    return b"".join(stream.feed(data[a:b]) for a, b in itertools.pairwise(bounds)) + stream.flush()


def events_of(out: bytes) -> list[dict[str, Any]]:
    """Each server-sent event's data, checked against the SDK's event types and numbered."""
    events = []
    for frame in out.decode().split("\n\n"):
        if frame:
            name, data = frame.split("\n")
            doc = json.loads(data.removeprefix("data: "))
            assert name == f"event: {doc['type']}"
            EVENTS.validate_python(doc)
            events.append(doc)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_a_text_stream_becomes_a_message_item_and_a_completed_response() -> None:
    events = events_of(translate(b"".join(TEXT_STREAM)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    response = Response.model_validate(events[-1]["response"])
    assert response.output_text == "Hello world" and response.status == "completed"
    assert response.model == "gpt-local" and response.instructions == "Be brief."
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 2)
    assert response.usage.input_tokens_details.cached_tokens == 8


def test_a_namespaced_call_names_its_namespace_and_tool_apart() -> None:
    data = b"".join(TOOL_STREAM).replace(b'"lookup"', b'"mcp__luftpause__spawn"')
    names = ToolNames({"mcp__luftpause__spawn": ToolName("spawn", "mcp__luftpause")})
    events = events_of(translate(data, names))
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == [
        {
            "id": done[0]["id"],
            "type": "function_call",
            "status": "completed",
            "call_id": "call_abc",
            "name": "spawn",
            "arguments": '{"q": "x"}',
            "namespace": "mcp__luftpause",
        }
    ]
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == '{"q": "x"}'


@given(st.lists(st.integers(min_value=0, max_value=3000), max_size=25))
def test_the_client_gets_the_same_bytes_however_the_engine_cuts_its_stream(
    cuts: list[int],
) -> None:
    data = b"".join(TOOL_STREAM)
    assert translate(data, cuts=cuts) == translate(data)


def test_a_custom_tool_call_gets_its_input_back_as_free_text() -> None:
    arguments = json.dumps({"input": "*** Begin Patch"})
    data = b"".join(
        sse(
            delta_chunk(
                {"tool_calls": [{"index": 0, "id": "p", "function": {"name": "apply_patch"}}]}
            ),
            delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}),
            delta_chunk({}, "tool_calls"),
            usage_chunk(5, 5, 0),
        )
    )
    names = ToolNames({"apply_patch": ToolName("apply_patch", None, custom=True)})
    events = events_of(translate(data, names))
    item = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert (item["type"], item["input"], item["call_id"]) == (
        "custom_tool_call",
        "*** Begin Patch",
        "p",
    )


def test_a_reply_cut_by_max_tokens_is_incomplete() -> None:
    data = b"".join(sse(delta_chunk({"content": "The ans"}), delta_chunk({}, "length")))
    events = events_of(translate(data))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_engine_error_mid_stream_fails_the_response() -> None:
    data = b"".join(TEXT_STREAM[:2]) + b'data: {"error": {"message": "out of memory"}}\n\n'
    events = events_of(translate(data))
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "out of memory"}


def test_a_whole_completion_becomes_a_response_the_sdk_reads() -> None:
    body = {
        "id": "chatcmpl-7",
        "object": "chat.completion",
        "created": 3,
        "model": "engine",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 10},
    }
    data, summary = translate_body(
        json.dumps(body).encode(), ResponsesWriter(REQUEST, ToolNames(), stream=False)
    )
    response = Response.model_validate_json(data)
    assert response.status == "completed" and response.created_at == 3
    call = response.output[0]
    assert call.type == "function_call"
    assert (call.call_id, call.name, call.arguments) == ("call_1", "exec_command", '{"cmd": "ls"}')
    assert summary.tool_call_ids == ("call_1",)
