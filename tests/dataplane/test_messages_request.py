"""Messages API requests: the checks, the echoed ids, and their Chat Completions form."""

from __future__ import annotations

import json
from typing import Any

import pytest

from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.messages.request import echoed_ids, read_request, to_chat


def read(**doc: Any) -> Any:
    base: dict[str, Any] = {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
    }
    return read_request(json.dumps({**base, **doc}).encode())


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"model": ""}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "9"}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"system": 5}, "system"),
        ({"tools": {}}, "tools"),
    ],
)
def test_a_request_breaking_the_apis_rules_is_a_bad_request(doc: dict[str, Any], says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        read(**doc)


def test_a_token_count_needs_no_max_tokens() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert read_request(json.dumps(body).encode(), counting=True).max_tokens == 0


def test_echoed_ids_are_the_tool_results_latest_first() -> None:
    request = read(
        messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "f"}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t2", "content": "x"},
                    {"type": "text", "text": "more"},
                ],
            },
        ]
    )
    assert list(echoed_ids(request.doc)) == ["t2", "t1"]


def test_system_blocks_tools_and_a_tool_round_translate_to_chat() -> None:
    request = read(
        system=[
            {"type": "text", "text": "You are terse."},
            {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}},
        ],
        tools=[
            {
                "name": "Bash",
                "description": "Run a command",
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        temperature=0.2,
        thinking={"type": "adaptive"},
        metadata={"user_id": "u"},
        stream=True,
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "list files"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Sure."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Bash",
                        "input": {"command": "ls"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "a.txt"}],
                    },
                    {"type": "text", "text": "and now?"},
                ],
            },
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        ],
    )
    assert to_chat(request) == {
        "model": "m",
        "max_tokens": 100,
        "temperature": 0.2,
        "stop": ["END"],
        "messages": [
            {"role": "system", "content": "You are terse.\n\nUse tools."},
            {"role": "user", "content": "list files"},
            {
                "role": "assistant",
                "content": "Sure.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "Bash", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"},
            {"role": "user", "content": "and now?"},
            {"role": "system", "content": "Be brief."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "Bash",
                    "parameters": {
                        "type": "object",
                        "properties": {"command": {"type": "string"}},
                    },
                    "description": "Run a command",
                },
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_images_become_image_url_parts_and_a_named_tool_choice_a_named_function() -> None:
    request = read(
        tools=[{"name": "f", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "f"},
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is it?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAA"},
                    },
                ],
            }
        ],
    )
    chat = to_chat(request)
    assert chat["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is it?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
            ],
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}


def test_a_pdf_document_cannot_be_translated() -> None:
    document = {"type": "document", "source": {"type": "base64", "data": "JVBER"}}
    request = read(messages=[{"role": "user", "content": [document]}])
    with pytest.raises(BadRequest, match=r"messages\.0\.content\.0"):
        to_chat(request)
