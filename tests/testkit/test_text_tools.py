"""The simulator's text tool style: calls written as `<tool_call>` blocks in ordinary replies.

Script tests are pure; the HTTP tests start a simulator in-process on loopback and drive it with
the official OpenAI client, every wait bounded by the client's timeout.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import pairwise
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from luftpause.testkit.engine.main import build_parser, params_from
from luftpause.testkit.engine.params import EngineParams, SimParams
from luftpause.testkit.engine.script import Reply, plan_reply
from luftpause.testkit.engine.server import RunningServer, serve
from luftpause.testkit.engine.tokens import (
    CHARS_PER_TOKEN,
    END,
    render_prompt,
    tokenize,
    tokenize_continuation,
)

TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "search_notes",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query", "limit"],
            },
        },
    },
    {"type": "function", "function": {"name": "second", "parameters": {}}},
]
SYSTEM = {"role": "system", "content": "Write calls as <tool_call>{json}</tool_call>. " * 20}
TEXT = {"x-sim-tool-style": "text", "x-sim-tool-rounds": "2"}


def _plan(messages: list[Any], *, style: Any = "text", max_tokens: int = 256, **body: Any) -> Reply:
    return plan_reply(
        {"messages": messages, **body},
        tool_rounds=2,
        reply_tokens=16,
        max_tokens=max_tokens,
        call_id="call_1",
        tool_style=style,
    )


def _answered(messages: list[Any], reply: Reply) -> list[Any]:
    """The history after the harness ran the call written in `reply`."""
    return [
        *messages,
        {"role": "assistant", "content": reply.content},
        {"role": "user", "content": "<tool_response>42 km</tool_response>"},
    ]


def test_text_style_writes_calls_as_plain_replies_until_k_then_answers() -> None:
    messages: list[Any] = [{"role": "user", "content": "How long is the Loire?"}]
    for _ in range(2):
        reply = _plan(messages)
        assert reply.finish_reason == "stop" and not reply.tool_calls
        text = reply.content or ""
        assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
        call = json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert call["name"] == "lookup" and set(call["arguments"]) == {"query"}
        assert isinstance(call["arguments"]["query"], str) and call["arguments"]["query"]
        assert all(len(p) == CHARS_PER_TOKEN for p in reply.pieces[:-1])
        assert reply.body == text
        messages = _answered(messages, reply)
    final = _plan(messages)
    assert final.finish_reason == "stop" and "<tool_call>" not in (final.content or "")
    assert len(final.pieces) == 16


def test_text_style_with_tools_offered_calls_the_first_tool_in_text() -> None:
    reply = _plan([{"role": "user", "content": "Find it."}], tools=TOOLS)
    assert not reply.tool_calls and reply.finish_reason == "stop"
    text = (reply.content or "").removeprefix("<tool_call>").removesuffix("</tool_call>")
    call = json.loads(text)
    assert call["name"] == "search_notes"
    assert call["arguments"]["limit"] == 1 and isinstance(call["arguments"]["query"], str)


def test_text_style_counts_only_assistant_text_calls_not_tool_messages() -> None:
    tool_history: list[Any] = [
        {"role": "user", "content": "Find it. <tool_call> in a user message does not count."},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
    ]
    assert (_plan(tool_history).content or "").startswith("<tool_call>")


def test_a_text_call_cut_at_max_tokens_finishes_with_length() -> None:
    reply = _plan([{"role": "user", "content": "Go."}], max_tokens=5)
    assert reply.finish_reason == "length" and len(reply.pieces) == 5
    assert (reply.content or "").startswith("<tool_call>")


def test_openai_style_is_unchanged_and_ignores_text_calls() -> None:
    messages: list[Any] = [{"role": "user", "content": "Find it."}]
    default = plan_reply(
        {"messages": messages, "tools": TOOLS},
        tool_rounds=2,
        reply_tokens=16,
        max_tokens=256,
        call_id="call_1",
    )
    assert default == _plan(messages, style="openai", tools=TOOLS)
    assert default.finish_reason == "tool_calls"
    assert [call.name for call in default.tool_calls] == ["search_notes"]
    text_history = _answered(messages, _plan(messages))
    assert _plan(text_history, style="openai").finish_reason == "stop"  # no tools offered
    assert "<tool_call>" not in (_plan(text_history, style="openai").content or "")


def test_a_text_reply_extends_the_prompt_so_the_next_turn_finds_it_cached() -> None:
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "Find it."}]
    text = render_prompt(messages, None)
    prompt = tokenize(text)
    reply = _plan(messages)
    history = tokenize_continuation(text, prompt, reply.body + END)
    follow_up = tokenize(render_prompt(_answered(messages, reply), None))
    whole = len(text + reply.body + END) // CHARS_PER_TOKEN
    assert follow_up[:whole] == history[:whole]
    assert whole >= len(prompt) + len(reply.pieces)


def test_the_fake_engine_cli_takes_a_tool_style() -> None:
    assert params_from(build_parser().parse_args([])).tool_style == "openai"
    assert params_from(build_parser().parse_args(["--tool-style", "text"])).tool_style == "text"
    with pytest.raises(ValueError, match="tool_style"):
        SimParams(tool_style="xml")  # type: ignore[arg-type]


FAST = EngineParams(prefill_ms_per_token=0.01, decode_base_ms=1.0, decode_ms_per_seq=0.0)


@asynccontextmanager
async def _client(**kwargs: Any) -> AsyncIterator[tuple[RunningServer, AsyncOpenAI]]:
    server = await serve(SimParams(engine=FAST, time_scale=1000.0, **kwargs))
    try:
        async with AsyncOpenAI(
            base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=20
        ) as client:
            yield server, client
    finally:
        await server.close()


async def test_a_text_style_conversation_gets_k_calls_then_an_answer_with_its_history_cached() -> (
    None
):
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "How long is the Loire?"}]
    seen: list[tuple[int, int, int]] = []  # prompt, completion, cached tokens per turn
    replies: list[str] = []
    async with _client() as (_, client):
        for _ in range(4):
            resp = await client.chat.completions.create(
                model="m", messages=messages, extra_headers=TEXT
            )
            use = resp.usage
            assert use is not None and use.prompt_tokens_details is not None
            seen.append(
                (
                    use.prompt_tokens,
                    use.completion_tokens,
                    use.prompt_tokens_details.cached_tokens or 0,
                )
            )
            choice = resp.choices[0]
            assert choice.finish_reason == "stop" and not choice.message.tool_calls
            content = choice.message.content or ""
            replies.append(content)
            if "<tool_call>" not in content:
                break
            call = json.loads(content.removeprefix("<tool_call>").removesuffix("</tool_call>"))
            assert call["name"] == "lookup"
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "user", "content": "<tool_response>42 km</tool_response>"})
    assert len(replies) == 3 and all("<tool_call>" in r for r in replies[:2])
    assert seen[0][2] == 0
    for (prompt, completion, _), (_, _, cached) in pairwise(seen):
        # The previous prompt and the reply it produced are both in the prefix cache.
        assert cached >= (prompt + completion) // 16 * 16


async def test_the_simulator_default_style_applies_unless_the_header_overrides_it() -> None:
    messages: Any = [{"role": "user", "content": "Find it."}]
    async with _client(tool_style="text") as (_, client):
        text = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert (text.choices[0].message.content or "").startswith('<tool_call>{"name": "search')
        assert text.choices[0].finish_reason == "stop"
        native = await client.chat.completions.create(
            model="m", messages=messages, tools=TOOLS, extra_headers={"x-sim-tool-style": "openai"}
        )
        assert native.choices[0].finish_reason == "tool_calls"
        with pytest.raises(openai.BadRequestError, match="x-sim-tool-style"):
            await client.chat.completions.create(
                model="m", messages=messages, extra_headers={"x-sim-tool-style": "xml"}
            )


async def test_a_streamed_text_call_arrives_as_content_deltas() -> None:
    messages: Any = [{"role": "user", "content": "Find it."}]
    async with _client() as (_, client):
        stream = await client.chat.completions.create(
            model="m", messages=messages, stream=True, extra_headers=TEXT
        )
        parts: list[str] = []
        finish = None
        async for chunk in stream:
            for choice in chunk.choices:
                assert not choice.delta.tool_calls
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
    text = "".join(parts)
    assert finish == "stop" and text.startswith("<tool_call>") and text.endswith("</tool_call>")
    assert json.loads(text[len("<tool_call>") : -len("</tool_call>")])["name"] == "lookup"
