"""The simulator's own Messages and Responses APIs, driven with the official clients."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from anthropic import AsyncAnthropic, BadRequestError
from anthropic.types import MessageParam, ToolParam, ToolResultBlockParam, ToolUseBlock
from openai import AsyncOpenAI

from luftpause.testkit.engine.params import EngineParams, SimParams
from luftpause.testkit.engine.scripted import parse_script
from luftpause.testkit.engine.server import RunningServer, serve

FAST = EngineParams(prefill_ms_per_token=0.01, decode_base_ms=1.0, decode_ms_per_seq=0.0)
LOOKUP: ToolParam = {
    "name": "lookup",
    "description": "Look something up.",
    "input_schema": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
}


@asynccontextmanager
async def engine(**kwargs: Any) -> AsyncIterator[RunningServer]:
    server = await serve(SimParams(engine=FAST, time_scale=1000.0, tool_rounds=1), **kwargs)
    try:
        yield server
    finally:
        await server.close()


async def test_a_messages_turn_with_a_tool_then_its_answer_streamed_and_not() -> None:
    async with engine() as server, asyncio.timeout(20):
        client = AsyncAnthropic(base_url=server.url, api_key="x", max_retries=0)
        ask: list[MessageParam] = [{"role": "user", "content": "How long is the Loire?"}]
        async with client.messages.stream(
            model="m", max_tokens=200, messages=ask, tools=[LOOKUP]
        ) as stream:
            first = await stream.get_final_message()
        assert first.stop_reason == "tool_use" and first.content[0].type == "tool_use"
        call = first.content[0]
        assert call.name == "lookup" and isinstance(call.input, dict) and call.input["query"]
        assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
        result: ToolResultBlockParam = {
            "type": "tool_result",
            "tool_use_id": call.id,
            "content": "1,012 km",
        }
        done = await client.messages.create(
            model="m",
            max_tokens=200,
            tools=[LOOKUP],
            messages=[
                *ask,
                {"role": "assistant", "content": first.content},
                {"role": "user", "content": [result]},
            ],
        )
        assert done.stop_reason == "end_turn" and done.content[0].type == "text"
        # The second turn's prompt extends the first: the engine found it in its prefix cache.
        assert done.usage.cache_read_input_tokens
        counted = await client.messages.count_tokens(model="m", messages=ask)
        assert counted.input_tokens > 0
        await client.close()


async def test_a_responses_turn_streamed_and_not() -> None:
    tools: Any = [{"type": "function", "name": "lookup", "parameters": LOOKUP["input_schema"]}]
    async with engine() as server, asyncio.timeout(20):
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        async with client.responses.stream(model="m", input="How long?", tools=tools) as stream:
            first = await stream.get_final_response()
        call = first.output[0]
        assert call.type == "function_call" and json.loads(call.arguments)["query"]
        done = await client.responses.create(
            model="m",
            tools=tools,
            input=[
                {"role": "user", "content": "How long?"},
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": "lookup",
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": "1,012 km"},
            ],
        )
        assert done.status == "completed" and done.output_text
        await client.close()


async def test_a_bad_messages_request_gets_anthropics_error_shape() -> None:
    async with engine() as server, asyncio.timeout(20):
        client = AsyncAnthropic(base_url=server.url, api_key="x", max_retries=0)
        with pytest.raises(BadRequestError) as caught:
            await client.messages.create(
                model="m", max_tokens=0, messages=[{"role": "user", "content": "x"}]
            )
        assert caught.value.body == {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "max_tokens: must be a positive integer",
            },
        }
        await client.close()


async def test_a_script_set_while_running_answers_the_requests_offering_its_tools() -> None:
    script = {
        "offers": ["lookup"],
        "replies": [
            {
                "calls": [
                    {"name": "lookup", "arguments": {"query": "Loire"}},
                    {"name": "lookup", "arguments": {"query": "Rhine"}},
                ]
            },
            {"text": ["Both: ", {"$collect": "km"}]},
        ],
    }
    async with engine() as server, asyncio.timeout(20), aiohttp.ClientSession() as http:
        async with http.post(server.url + "/debug/script", json=script) as resp:
            assert resp.status == 200 and (await resp.json())["script"]["replies"] == 2
        async with http.post(server.url + "/debug/script", json={"replies": 3}) as resp:
            assert resp.status == 400  # a bad script leaves the one set
        client = AsyncAnthropic(base_url=server.url, api_key="x", max_retries=0)
        ask: list[MessageParam] = [{"role": "user", "content": "Rivers?"}]
        first = await client.messages.create(
            model="m", max_tokens=300, messages=ask, tools=[LOOKUP]
        )
        assert [(b.type, getattr(b, "input", None)) for b in first.content] == [
            ("tool_use", {"query": "Loire"}),
            ("tool_use", {"query": "Rhine"}),
        ]
        uses = [b for b in first.content if isinstance(b, ToolUseBlock)]
        results: list[ToolResultBlockParam] = [
            {"type": "tool_result", "tool_use_id": b.id, "content": json.dumps({"km": km})}
            for b, km in zip(uses, (1012, 1233), strict=True)
        ]
        messages: list[MessageParam] = [
            *ask,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": results},
        ]
        done = await client.messages.create(
            model="m", max_tokens=300, messages=messages, tools=[LOOKUP]
        )
        assert done.content[0].type == "text" and done.content[0].text == "Both: 1012; 1233"
        # Without the script's tools, the usual plan: no tools, a final answer.
        plain = await client.messages.create(model="m", max_tokens=300, messages=ask)
        assert plain.content[0].type == "text" and not plain.content[0].text.startswith("Both")
        await client.close()


async def test_a_script_given_at_start_is_there_from_the_first_request() -> None:
    script = parse_script({"replies": [{"text": "scripted"}]})
    async with engine(script=script) as server, asyncio.timeout(20):
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == "scripted"
        await client.close()
