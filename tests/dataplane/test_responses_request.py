"""Responses API requests: the checks, the echoed call ids, and their Chat Completions form."""

from __future__ import annotations

import json
from typing import Any

import pytest

from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.responses.request import (
    ToolName,
    echoed_ids,
    joined,
    read_request,
    to_chat,
)


def read(**doc: Any) -> Any:
    base: dict[str, Any] = {"model": "m", "input": "hi"}
    return read_request(json.dumps({**base, **doc}).encode())


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"model": 1}, "model"),
        ({"input": []}, "input"),
        ({"input": ["x"]}, "input"),
        ({"max_output_tokens": -1}, "max_output_tokens"),
        ({"stream": 1}, "stream"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
    ],
)
def test_a_request_breaking_the_rules_is_a_bad_request(doc: dict[str, Any], says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        read(**doc)


CODEX_LIKE: list[dict[str, Any]] = [
    {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "Be a coder."}],
    },
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
    {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd":"ls"}'},
    {
        "type": "function_call",
        "call_id": "c2",
        "namespace": "mcp__luftpause",
        "name": "spawn",
        "arguments": '{"task":"t"}',
    },
    {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
    {
        "type": "function_call_output",
        "call_id": "c2",
        "output": [{"type": "input_text", "text": '{"handle":"run-1"}'}],
    },
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
]


def test_echoed_ids_are_the_tool_outputs_call_ids_latest_first() -> None:
    assert list(echoed_ids(read(input=CODEX_LIKE).doc)) == ["c2", "c1"]


def test_a_codex_conversation_translates_to_chat_with_calls_gathered_in_one_turn() -> None:
    request = read(
        instructions="Answer briefly.",
        input=CODEX_LIKE,
        tools=[
            {
                "type": "function",
                "name": "exec_command",
                "parameters": {"type": "object"},
                "strict": False,
            },
            {
                "type": "namespace",
                "name": "mcp__luftpause",
                "description": "sub-agents",
                "tools": [{"type": "function", "name": "spawn", "description": "Spawn a run."}],
            },
            {"type": "custom", "name": "apply_patch", "description": "Patch files."},
            {"type": "web_search", "external_web_access": False},
        ],
        tool_choice="auto",
        parallel_tool_calls=True,
        max_output_tokens=500,
        reasoning={"summary": "auto"},
        store=False,
        stream=True,
    )
    chat, names = to_chat(request)
    assert chat["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "system", "content": "Be a coder."},
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "exec_command", "arguments": '{"cmd":"ls"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "mcp__luftpause__spawn", "arguments": '{"task":"t"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"handle":"run-1"}'},
        {"role": "assistant", "content": "Done."},
    ]
    assert [t["function"]["name"] for t in chat["tools"]] == [
        "exec_command",
        "mcp__luftpause__spawn",
        "apply_patch",
    ]
    assert chat["tools"][2]["function"]["parameters"]["required"] == ["input"]
    assert names.of("mcp__luftpause__spawn") == ToolName("spawn", "mcp__luftpause")
    assert names.of("apply_patch") == ToolName("apply_patch", None, custom=True)
    assert names.of("exec_command") == ToolName("exec_command")
    assert (chat["max_tokens"], chat["tool_choice"], chat["parallel_tool_calls"]) == (
        500,
        "auto",
        True,
    )
    assert chat["stream_options"] == {"include_usage": True}
    assert "reasoning" not in chat and "store" not in chat


def test_a_namespace_ending_in_an_underscore_is_not_doubled() -> None:
    assert joined("mcp__x__", "f") == "mcp__x__f"
    assert joined("tools", "f") == "tools__f"
    assert joined(None, "f") == "f"


def test_a_custom_tool_call_in_history_carries_its_input_as_the_input_argument() -> None:
    request = read(
        input=[
            {"role": "user", "content": "patch it"},
            {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch", "input": "*** x"},
            {"type": "custom_tool_call_output", "call_id": "p1", "output": "ok"},
        ]
    )
    chat, _ = to_chat(request)
    call = chat["messages"][1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"input": "*** x"}
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "p1", "content": "ok"}


def test_text_format_json_schema_becomes_response_format_and_images_image_url_parts() -> None:
    request = read(
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what?"},
                    {
                        "type": "input_image",
                        "image_url": "data:image/png;base64,AA",
                        "detail": "low",
                    },
                ],
            }
        ],
        text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
    )
    chat, _ = to_chat(request)
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}},
    }
    assert chat["messages"][0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA", "detail": "low"},
    }


def test_a_file_input_cannot_be_translated() -> None:
    request = read(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])
    with pytest.raises(BadRequest, match=r"input\.0\.content\.0"):
        to_chat(request)
