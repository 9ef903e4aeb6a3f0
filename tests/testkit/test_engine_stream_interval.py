"""The stream interval, SGLang's KV metrics and /server_info, and SGLang admission over HTTP.

Frame grouping is checked on `wire` without sockets; the rest on loopback with the official
OpenAI client. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.params import EngineParams
from luftpause.testkit.engine.script import plan_reply
from tests.testkit.test_engine_server import FAST, TOOLS, engine, metrics, openai_client, until

ENV = wire.Envelope(id="chatcmpl-1", created=0, model="m", fingerprint="e")


def groups(total: int, interval: int) -> list[int]:
    """Tokens per frame of a `total`-token stream."""
    sizes, start = [], 0
    for index in range(total):
        if wire.flush_after(index, total, interval):
            sizes.append(index + 1 - start)
            start = index + 1
    return sizes


def frames(reply: Any, interval: int) -> list[dict[str, Any]]:
    """The token frames of `reply` at `interval`, decoded."""
    out, start, total = [], 0, len(reply.pieces)
    for index in range(total):
        if wire.flush_after(index, total, interval):
            raw = wire.tokens_chunk(ENV, reply, start, index + 1, 2)
            out.append(json.loads(raw.removeprefix(b"data: ")))
            start = index + 1
    return out


def test_a_stream_sends_the_first_token_then_one_frame_per_interval_then_the_rest() -> None:
    assert groups(10, 4) == [1, 4, 4, 1]
    assert groups(10, 1) == [1] * 10
    assert groups(9, 4) == [1, 4, 4]
    assert groups(3, 8) == [1, 2]
    assert groups(1, 4) == [1]


def test_grouped_frames_carry_every_token_text_and_logprob_once() -> None:
    body: Any = {"messages": [{"role": "user", "content": "Say something."}]}
    reply = plan_reply(body, tool_rounds=0, reply_tokens=10, max_tokens=10, call_id="call_1")
    chunks = frames(reply, 4)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and "role" not in deltas[1]
    assert "".join(d["content"] for d in deltas) == reply.content
    tokens = [lp["token"] for c in chunks for lp in c["choices"][0]["logprobs"]["content"]]
    assert tokens == list(reply.pieces)


def test_grouped_tool_call_frames_reassemble_the_same_arguments() -> None:
    body: Any = {"messages": [{"role": "user", "content": "Find it."}], "tools": TOOLS}
    reply = plan_reply(body, tool_rounds=1, reply_tokens=10, max_tokens=256, call_id="call_1")
    for interval in (1, 3, 100):
        calls = [
            call for c in frames(reply, interval) for call in c["choices"][0]["delta"]["tool_calls"]
        ]
        assert calls[0]["id"] == "call_1" and calls[0]["function"]["name"] == "lookup"
        arguments = "".join(call["function"]["arguments"] for call in calls)
        assert arguments == reply.tool_calls[0].arguments and json.loads(arguments)["query"]


async def stream_text(client: Any, messages: Any, **kw: Any) -> tuple[str, list[int]]:
    """The streamed content and the number of tokens (logprob entries) in each frame."""
    stream = await client.chat.completions.create(
        model="m", messages=messages, stream=True, logprobs=True, **kw
    )
    text, sizes = "", []
    async with asyncio.timeout(30):
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                sizes.append(len(chunk.choices[0].logprobs.content))
    return text, sizes


async def test_a_streamed_reply_at_interval_four_arrives_as_one_four_four_one_tokens() -> None:
    messages: Any = [{"role": "user", "content": "Say something."}]
    texts = []
    for interval in (1, 4):
        async with (
            engine(engine=FAST, stream_interval=interval) as server,
            openai_client(server) as client,
        ):
            text, sizes = await stream_text(client, messages, max_tokens=10)
            plain = await client.chat.completions.create(
                model="m", messages=messages, max_tokens=10
            )
        assert sizes == ([1] * 10 if interval == 1 else [1, 4, 4, 1])
        assert text == plain.choices[0].message.content
        texts.append(text)
    assert texts[0] == texts[1]


async def test_a_streamed_tool_call_at_an_interval_reassembles_to_its_json_arguments() -> None:
    messages: Any = [{"role": "user", "content": "Find the report."}]
    async with (
        engine(engine=FAST, stream_interval=3) as server,
        openai_client(server) as client,
    ):
        stream = await client.chat.completions.create(
            model="m", messages=messages, tools=TOOLS, stream=True
        )
        arguments, frames_seen = "", 0
        async with asyncio.timeout(30):
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.tool_calls:
                    frames_seen += 1
                    fn = chunk.choices[0].delta.tool_calls[0].function
                    arguments += (fn.arguments if fn else None) or ""
        plain = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    call = (plain.choices[0].message.tool_calls or [])[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert arguments == call.function.arguments
    assert json.loads(arguments)["query"]
    assert plain.usage is not None
    tokens = plain.usage.completion_tokens
    assert frames_seen == len(groups(tokens, 3)) < tokens


def cache_config_labels(text: str) -> dict[str, str]:
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
    assert line.endswith("} 1")
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


async def test_metrics_report_the_kv_pool_in_tokens_and_the_cache_configuration() -> None:
    params = EngineParams(
        kv_tokens=4096, block_size=16, admission="sglang", decode_base_ms=1.0, decode_ms_per_seq=0
    )
    messages: Any = [{"role": "user", "content": "Say something."}]
    async with (
        engine(engine=params, replica_id="e1") as server,
        openai_client(server) as client,
        aiohttp.ClientSession() as http,
    ):
        await client.chat.completions.create(model="m", messages=messages, max_tokens=40)
        m = await metrics(http, server)
        async with http.get(server.url + "/metrics") as resp:
            labels = cache_config_labels(await resp.text())
    assert m["sglang:max_total_num_tokens"] == 4096
    assert m["sglang:num_used_tokens"] == m["sglang:kv_used_tokens"] == 0
    assert m["sglang:kv_evictable_tokens"] > 0  # the finished request's blocks stay cached
    assert m["sglang:kv_available_tokens"] + m["sglang:kv_evictable_tokens"] == 4096
    assert m["sglang:token_usage"] == 0
    assert 0.098 <= m["sglang:new_token_ratio"] < 0.7  # it decayed once per decode step
    assert m["sglang:num_retracted_requests_total"] == 0
    assert labels == {
        "model_name": "luftpause-sim",
        "engine": "e1",
        "num_gpu_blocks": "256",
        "block_size": "16",
        "kv_cache_size_tokens": "4096",
    }


async def test_metrics_count_a_running_requests_blocks_as_used_tokens() -> None:
    slow = EngineParams(kv_tokens=4096, block_size=16, decode_base_ms=3_600_000.0)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi " * 100}], "max_tokens": 8}
    async with (
        engine(engine=slow, time_scale=1.0) as server,
        aiohttp.ClientSession() as http,
    ):
        task = asyncio.create_task(http.post(server.url + "/v1/chat/completions", json=body))

        async def running() -> bool:
            return (await metrics(http, server))["sglang:num_running_reqs"] == 1

        await until(running)
        m = await metrics(http, server)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # Reserving, the request holds blocks for its prompt and its 8 reply tokens.
    assert m["sglang:num_used_tokens"] == m["sglang:kv_used_tokens"] > 0
    assert m["sglang:num_used_tokens"] % 16 == 0
    assert m["sglang:token_usage"] == m["sglang:num_used_tokens"] / 4096
    assert m["sglang:kv_available_tokens"] == 4096 - m["sglang:num_used_tokens"]
    assert m["sglang:new_token_ratio"] == 1.0


async def test_server_info_gives_the_pool_size_and_limits_at_top_level() -> None:
    params = EngineParams(kv_tokens=1000, block_size=16, max_running=12, admission="sglang")
    async with (
        engine(engine=params, stream_interval=2) as server,
        aiohttp.ClientSession() as http,
        http.get(server.url + "/server_info") as resp,
    ):
        assert resp.status == 200
        info = await resp.json()
    assert info["max_total_num_tokens"] == 992  # whole blocks only
    assert info["max_running_requests"] == 12
    assert info["admission"] == "sglang"
    assert info["page_size"] == 16 and info["stream_interval"] == 2


async def test_an_engine_without_server_info_answers_404_and_exports_only_its_own_names() -> None:
    async with (
        engine(server_info=False, metrics="vllm") as server,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(server.url + "/server_info") as resp:
            assert resp.status == 404
            assert "error" in await resp.json()
        async with http.get(server.url + "/metrics") as resp:
            text = await resp.text()
    assert "vllm:num_requests_running" in text and "sglang:" not in text


async def test_streams_retracted_for_lack_of_blocks_stall_and_finish_with_the_same_reply() -> None:
    # 128 blocks of 4 tokens; eight 100-token replies need about 860 tokens: SGLang's
    # admission lets more start than fit, and some are retracted and resumed.
    tight = EngineParams(
        kv_tokens=512,
        block_size=4,
        admission="sglang",
        prefill_ms_per_token=0.0,
        decode_base_ms=4.0,
        decode_ms_per_seq=0.0,
    )
    messages: Any = [{"role": "user", "content": "Tell me about it."}]
    async with (
        engine(engine=tight, time_scale=1.0, reply_tokens=100) as server,
        openai_client(server) as client,
        aiohttp.ClientSession() as http,
    ):
        results = await asyncio.gather(
            *(stream_text(client, messages, max_tokens=100) for _ in range(8))
        )
        m = await metrics(http, server)
        plain = await client.chat.completions.create(model="m", messages=messages, max_tokens=100)
    assert m["sglang:num_retracted_requests_total"] > 0
    assert m["luftpause_sim_finished_total"] == 8 and m["luftpause_sim_aborted_total"] == 0
    for text, sizes in results:
        assert text == plain.choices[0].message.content
        assert sizes == [1] * 100
