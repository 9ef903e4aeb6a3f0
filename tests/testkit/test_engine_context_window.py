"""The simulator's context window (`--context-window`) and its scripted summary reply, over HTTP
on loopback with the official OpenAI client."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import (
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)

from luftpause.testkit.engine.main import params_from, parse_args
from luftpause.testkit.engine.script import is_summary_request, summary_reply
from tests.testkit.test_engine_server import FAST, engine, openai_client

SUMMARY_ASK = "Summarize the conversation so far for your own later use. Keep every fact."


def conversation(results: int, words: int = 20) -> list[ChatCompletionMessageParam]:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "find the rivers"}]
    for i in range(results):
        call: ChatCompletionMessageFunctionToolCallParam = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "lookup", "arguments": "{}"},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        text = f"River {i} is {1000 + i} km long; " + "more " * words
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": text})
    return messages


async def test_a_prompt_plus_reply_longer_than_the_window_is_refused_as_openai_does() -> None:
    async with engine(engine=FAST, context_window=300) as server, openai_client(server) as client:
        fits = await client.chat.completions.create(
            model="m", messages=conversation(1), max_tokens=16
        )
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="m", messages=conversation(6), max_tokens=16)
    assert fits.choices[0].message.content
    assert refused.value.code == "context_length_exceeded"
    assert refused.value.status_code == 400
    assert "maximum context length is 300 tokens" in refused.value.message


async def test_the_reserved_reply_counts_against_the_window() -> None:
    async with engine(engine=FAST, context_window=300) as server, openai_client(server) as client:
        with pytest.raises(openai.BadRequestError, match="in the completion"):
            await client.chat.completions.create(
                model="m", messages=conversation(1), max_tokens=290
            )


async def test_models_says_the_window_as_vllm_does_only_when_there_is_one() -> None:
    async with engine(context_window=4096) as server, openai_client(server) as client:
        [entry] = (await client.models.list()).data
    assert entry.model_dump()["max_model_len"] == 4096
    async with engine() as server, openai_client(server) as client:
        [plain] = (await client.models.list()).data
    assert "max_model_len" not in plain.model_dump()


async def test_a_summary_request_gets_notes_of_each_tool_result() -> None:
    messages: list[ChatCompletionMessageParam] = [
        *conversation(3),
        {"role": "user", "content": SUMMARY_ASK},
    ]
    async with engine(engine=FAST) as server, openai_client(server) as client:
        reply = await client.chat.completions.create(model="m", messages=messages, max_tokens=200)
        log = await _debug(server.url)
    text = reply.choices[0].message.content or ""
    assert text.startswith("Notes on 3 earlier results")
    assert all(f"River {i} is {1000 + i} km" in text for i in range(3))
    assert [r["summary"] for r in log if r["path"] == "/v1/chat/completions"] == [True]


def test_a_summary_is_cut_at_max_tokens_and_an_earlier_summary_is_noted() -> None:
    earlier: ChatCompletionMessageParam = {
        "role": "user",
        "content": "[Summary of rounds 1-4 ...]\nRiver 0 is long",
    }
    messages: list[ChatCompletionMessageParam] = [
        conversation(0)[0],
        earlier,
        *conversation(5)[1:],
        {"role": "user", "content": SUMMARY_ASK},
    ]
    assert is_summary_request(messages) and not is_summary_request(conversation(2))
    reply = summary_reply(messages, max_tokens=5)
    assert len(reply.pieces) == 5 and reply.finish_reason == "length"
    assert "Notes on 6 earlier results" in "".join(summary_reply(messages, 500).pieces)


def test_the_flag_sets_the_window_and_refuses_zero() -> None:
    assert params_from(parse_args(["--context-window", "2048"], {})).context_window == 2048
    assert params_from(parse_args([], {"LUFTPAUSE_CONTEXT_WINDOW": "512"})).context_window == 512
    assert params_from(parse_args([], {})).context_window is None
    with pytest.raises(SystemExit):
        parse_args(["--context-window", "0"], {})


async def _debug(url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(url + "/debug/requests") as resp:
        return list((await resp.json())["requests"])
