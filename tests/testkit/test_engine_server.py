"""The engine simulator over HTTP on loopback, driven with the official OpenAI client.

Simulated time runs fast (large time scale) or, where a test needs a request to stay put,
an iteration is made to last longer than the test. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from luftpause.testkit.engine.params import EngineParams, SimParams
from luftpause.testkit.engine.server import RunningServer, serve

FAST = EngineParams(prefill_ms_per_token=0.01, decode_base_ms=1.0, decode_ms_per_seq=0.0)
SYSTEM: dict[str, Any] = {
    "role": "system",
    "content": "You are a careful assistant who plans each step. " * 30,
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


@asynccontextmanager
async def engine(**kwargs: Any) -> AsyncIterator[RunningServer]:
    kwargs.setdefault("time_scale", 1000.0)
    server = await serve(SimParams(**kwargs))
    try:
        yield server
    finally:
        await server.close()


@asynccontextmanager
async def openai_client(server: RunningServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
        yield client


async def metrics(session: aiohttp.ClientSession, server: RunningServer) -> dict[str, float]:
    async with session.get(server.url + "/metrics") as resp:
        text = await resp.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("{")[0], line.rsplit(" ", 1)[1]
            values[name] = float(value)
    return values


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.01)


async def test_a_streamed_completion_arrives_token_by_token_with_cached_usage() -> None:
    messages: Any = [SYSTEM, {"role": "user", "content": "Say something."}]
    async with engine(replica_id="engine-7") as server, openai_client(server) as client:
        usages = []
        for _ in range(2):
            stream = await client.chat.completions.create(
                model="any-model",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
            async with asyncio.timeout(30):
                chunks = [chunk async for chunk in stream]
            content = [c for c in chunks if c.choices and c.choices[0].delta.content]
            assert len(content) == 64
            assert chunks[-2].choices[0].finish_reason == "stop"
            assert {c.system_fingerprint for c in chunks} == {"engine-7"}
            assert {c.model for c in chunks} == {"any-model"}
            assert chunks[-1].usage is not None
            usages.append(chunks[-1].usage)
    first, second = usages
    assert first.completion_tokens == 64
    assert first.prompt_tokens_details is not None and second.prompt_tokens_details is not None
    assert first.prompt_tokens_details.cached_tokens == 0
    cached = second.prompt_tokens_details.cached_tokens
    assert cached == (second.prompt_tokens - 1) // 16 * 16


async def test_an_agent_gets_tool_calls_then_an_answer_and_reuses_its_cached_history() -> None:
    messages: Any = [SYSTEM, {"role": "user", "content": "Find the report."}]
    async with engine() as server, openai_client(server) as client:
        prompts: list[int] = []
        cached: list[int] = []
        for _ in range(3):
            resp = await client.chat.completions.create(
                model="m",
                messages=messages,
                tools=TOOLS,
                extra_headers={"x-sim-tool-rounds": "2"},
            )
            assert resp.usage is not None and resp.usage.prompt_tokens_details is not None
            prompts.append(resp.usage.prompt_tokens)
            cached.append(resp.usage.prompt_tokens_details.cached_tokens or 0)
            message = resp.choices[0].message
            if resp.choices[0].finish_reason == "stop":
                break
            assert resp.choices[0].finish_reason == "tool_calls"
            call = (message.tool_calls or [])[0]
            assert call.type == "function" and call.id.startswith("call_")
            assert call.function.name == "lookup"
            assert json.loads(call.function.arguments)["query"]
            messages.append(message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "found it"})
    assert resp.choices[0].finish_reason == "stop" and len(prompts) == 3
    # Each turn finds the previous prompt and the reply it produced in the prefix cache.
    assert cached[1] >= prompts[0] // 16 * 16
    assert cached[2] >= prompts[1] // 16 * 16


async def test_metrics_show_queued_requests_while_the_kv_pool_is_full() -> None:
    # 16 blocks of 16 tokens; each request needs 10+; an iteration lasts a simulated hour.
    tiny = EngineParams(kv_tokens=256, block_size=16, decode_base_ms=3_600_000.0)
    async with engine(engine=tiny, time_scale=1.0) as server, aiohttp.ClientSession() as http:
        url = server.url + "/v1/chat/completions"
        bodies = [
            {
                "model": "m",
                "messages": [{"role": "user", "content": f"{i} " * 300}],
                "max_tokens": 16,
            }
            for i in range(3)
        ]
        tasks = [asyncio.create_task(http.post(url, json=body)) for body in bodies]

        async def queued() -> bool:
            m = await metrics(http, server)
            return m["sglang:num_queue_reqs"] == 2 and m["vllm:num_requests_waiting"] == 2

        await until(queued)
        m = await metrics(http, server)
        assert m["sglang:num_running_reqs"] == 1 and m["vllm:num_requests_running"] == 1
        assert m["sglang:token_usage"] > 0.5 and m["vllm:kv_cache_usage_perc"] > 0.5
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

        async def all_aborted() -> bool:
            m = await metrics(http, server)
            return m["luftpause_sim_aborted_total"] == 3

        await until(all_aborted)
        m = await metrics(http, server)
        assert m["sglang:num_running_reqs"] == 0 and m["sglang:num_queue_reqs"] == 0
        assert m["vllm:gpu_cache_usage_perc"] == 0


async def test_a_client_that_disconnects_mid_stream_aborts_its_request() -> None:
    messages: Any = [{"role": "user", "content": "Tell me a long story."}]
    slow = engine(reply_tokens=2000, default_max_tokens=2000, time_scale=5.0)
    async with slow as server, openai_client(server) as client, aiohttp.ClientSession() as http:
        stream = await client.chat.completions.create(model="m", messages=messages, stream=True)
        received = 0
        async with asyncio.timeout(30):
            async for _ in stream:
                received += 1
                if received == 3:
                    break
        await stream.close()

        async def aborted() -> bool:
            m = await metrics(http, server)
            return m["luftpause_sim_aborted_total"] == 1 and m["sglang:num_running_reqs"] == 0

        await until(aborted)
        m = await metrics(http, server)
        assert m["sglang:token_usage"] == 0
        assert m["vllm:generation_tokens_total"] < 2000


async def test_hosted_mode_answers_429_with_retry_after_past_the_request_budget() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with (
        engine(engine=FAST, rpm=2, time_scale=1.0) as server,
        aiohttp.ClientSession() as http,
    ):
        url = server.url + "/v1/chat/completions"
        statuses, headers = [], []
        for _ in range(3):
            async with http.post(url, json=body) as resp:
                statuses.append(resp.status)
                headers.append(resp.headers)
                payload = await resp.json()
        assert statuses == [200, 200, 429]
        assert headers[0]["x-ratelimit-limit-requests"] == "2"
        assert headers[0]["x-ratelimit-remaining-requests"] == "1"
        assert headers[0]["x-ratelimit-reset-requests"].endswith("s")
        assert 1 <= int(headers[2]["Retry-After"]) <= 60
        assert payload["error"]["type"] == "rate_limit_exceeded"
        m = await metrics(http, server)
        assert m["luftpause_sim_rate_limited_total"] == 1
        assert m["luftpause_sim_requests_total"] == 3


async def test_hosted_mode_refuses_a_request_past_the_token_budget() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    async with (
        engine(engine=FAST, tpm=50, time_scale=1.0) as server,
        aiohttp.ClientSession() as http,
        http.post(server.url + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 429
        assert resp.headers["x-ratelimit-limit-tokens"] == "50"
        assert "Retry-After" in resp.headers


async def test_a_single_pass_engine_classifies_in_vllms_shape() -> None:
    labels = ("urgent", "lookup", "chitchat")
    async with engine(kind="single-pass", labels=labels) as server, aiohttp.ClientSession() as http:
        body = {"model": "clf", "input": ["the server is down", "hello"]}
        async with http.post(server.url + "/classify", json=body) as resp:
            assert resp.status == 200
            out = await resp.json()
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        async with http.post(server.url + "/v1/chat/completions", json=chat) as resp:
            assert resp.status == 404
    assert out["object"] == "list" and out["model"] == "clf"
    assert [d["index"] for d in out["data"]] == [0, 1]
    for item in out["data"]:
        assert item["num_classes"] == 3 and item["label"] in labels
        assert abs(sum(item["probs"]) - 1.0) < 1e-9
        assert item["label"] == labels[item["probs"].index(max(item["probs"]))]
    assert out["usage"]["prompt_tokens"] > 0


async def test_a_generative_engine_does_not_serve_classify() -> None:
    async with (
        engine() as server,
        aiohttp.ClientSession() as http,
        http.post(server.url + "/classify", json={"input": "x"}) as resp,
    ):
        assert resp.status == 404
        assert "error" in await resp.json()


async def test_bad_json_and_missing_messages_are_answered_400() -> None:
    async with engine() as server, aiohttp.ClientSession() as http:
        url = server.url + "/v1/chat/completions"
        async with http.post(url, data=b"{not json") as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["message"]
        async with http.post(url, json={"model": "m"}) as resp:
            assert resp.status == 400
            assert "messages" in (await resp.json())["error"]["message"]


async def test_a_required_key_rejects_requests_without_it() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with engine(engine=FAST, require_key="sk-sim") as server, aiohttp.ClientSession() as http:
        url = server.url + "/v1/chat/completions"
        async with http.post(url, json=body) as resp:
            assert resp.status == 401
        auth = {"Authorization": "Bearer sk-sim"}
        async with http.post(url, json=body, headers=auth) as resp:
            assert resp.status == 200
        async with http.get(server.url + "/health") as resp:
            assert resp.status == 200 and await resp.json() == {"status": "ok"}


async def test_debug_requests_show_every_header_and_reset_clears_them() -> None:
    body = {"model": "mine", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"Authorization": "Bearer client-secret", "X-Trace": "abc"}
    async with (
        engine(engine=FAST) as server,
        aiohttp.ClientSession() as http,
        http.post(server.url + "/v1/chat/completions", json=body, headers=headers),
    ):
        pass
        async with http.get(server.url + "/debug/requests") as resp:
            seen = (await resp.json())["requests"]
        assert len(seen) == 1
        assert seen[0]["headers"]["Authorization"] == "Bearer client-secret"
        assert seen[0]["headers"]["X-Trace"] == "abc"
        assert (seen[0]["model"], seen[0]["stream"], seen[0]["path"]) == (
            "mine",
            False,
            "/v1/chat/completions",
        )
        assert seen[0]["tcp_nodelay"] is True and seen[0]["max_tokens"] == 2
        async with http.post(server.url + "/debug/reset") as resp:
            assert resp.status == 200
        async with http.get(server.url + "/debug/requests") as resp:
            assert (await resp.json())["requests"] == []
        m = await metrics(http, server)
        assert m["luftpause_sim_requests_total"] == 0 and m["vllm:prefix_cache_queries_total"] == 0


async def test_models_lists_the_configured_model() -> None:
    async with engine(model="sim-x") as server, openai_client(server) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["sim-x"]


async def test_the_engine_serves_32_streams_and_50_plain_requests_at_once() -> None:
    async with engine(time_scale=200.0, reply_tokens=24) as server, openai_client(server) as client:

        async def streamed(i: int) -> int:
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": f"stream {i}"}],
                stream=True,
            )
            tokens = 0
            async for chunk in stream:
                tokens += bool(chunk.choices and chunk.choices[0].delta.content)
            return tokens

        async def plain(i: int) -> int:
            resp = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"plain {i}"}]
            )
            assert resp.usage is not None
            return resp.usage.completion_tokens

        async with asyncio.timeout(60):
            counts = await asyncio.gather(
                *(streamed(i) for i in range(32)), *(plain(i) for i in range(50))
            )
    assert counts == [24] * 82


async def test_logprobs_come_back_for_every_token_in_openais_shape() -> None:
    messages: Any = [{"role": "user", "content": "Answer with one of: yes, no, maybe."}]
    async with engine(reply_tokens=5) as server, openai_client(server) as client:
        resp = await client.chat.completions.create(
            model="m", messages=messages, logprobs=True, top_logprobs=3
        )
        stream = await client.chat.completions.create(
            model="m", messages=messages, logprobs=True, top_logprobs=3, stream=True
        )
        async with asyncio.timeout(30):
            streamed = [
                c.choices[0].logprobs.content
                async for c in stream
                if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
            ]
    assert resp.choices[0].logprobs is not None
    content = resp.choices[0].logprobs.content or []
    assert len(content) == 5 and all(len(t.top_logprobs) == 3 for t in content)
    assert content[0].token in ("yes", "no", "maybe")
    assert {t.token for t in content[0].top_logprobs} == {"yes", "no", "maybe"}
    assert [c[0].token for c in streamed] == [t.token for t in content]


async def test_an_unknown_path_gets_the_same_json_error_shape() -> None:
    async with (
        engine() as server,
        aiohttp.ClientSession() as http,
        http.get(server.url + "/v1/nothing") as resp,
    ):
        assert resp.status == 404
        assert (await resp.json())["error"]["message"]
