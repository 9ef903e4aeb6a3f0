"""A real batching engine behind luftpause: one vLLM CPU replica serving Gemma 3 270M
(bench/vllm_pool.py), a scheduler and a dataplane in front of it.

The scheduler's prober reads the replica's load and KV pool from vLLM's own /metrics; a turn
through the dataplane streams a tool call that vLLM's hermes parser found in the model's reply;
a repeated prefix comes back as cached tokens in `usage`, streamed or not; and a request vLLM
refuses reaches the official client as a clean 400.

Marked real_engine: `make test` skips it; `make test-real` runs it once `make vllm` has built
the venv and the model, and skips it saying so until then (alone:
`.venv/bin/pytest -m real_engine tests/real/test_vllm.py`, about 3 minutes), inside
`flock /tmp/luftpause-bench.lock` when benchmarks share the machine.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from bench.vllm_pool import MODEL, VllmUnavailable, check_built, start_vllm_engines
from luftpause.scheduler.engine_load import parse_load
from luftpause.testkit.agents import LOOKUP_TOOL
from luftpause.testkit.preambles import FILLER
from luftpause.testkit.stack import Endpoint, Launcher, write_endpoints
from luftpause.testkit.vllm_model import check_prompt
from luftpause.testkit.waits import eventually, read_metrics

pytestmark = [
    pytest.mark.real_engine,
    pytest.mark.timeout(900),
    pytest.mark.asyncio(loop_scope="module"),
]
MAX_MODEL_LEN = 4096
KV_TOKENS = 32_768
REPLICA = "vllm-0"


@dataclass(frozen=True, slots=True)
class Stack:
    engine: str  # the replica's base URL
    front: str  # the dataplane's OpenAI base URL (with /v1)
    scheduler: str  # the scheduler's HTTP base URL


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    try:
        check_built()
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    workdir: Path = tmp_path_factory.mktemp("vllm")
    async with AsyncExitStack() as exits:
        [engine] = await start_vllm_engines(
            exits, workdir, 1, kv_tokens=KV_TOKENS, max_num_seqs=8, max_model_len=MAX_MODEL_LEN
        )
        config = write_endpoints(
            workdir / "endpoints.yaml", [Endpoint(id=REPLICA, url=engine, models=(MODEL,))]
        )
        launcher = Launcher(workdir, exits)
        scheduler = await launcher.scheduler(config, "--probe-period", "0.5", ready="/ready")
        dataplane = await launcher.dataplane(scheduler, ready="/ready")
        yield Stack(engine=engine, front=dataplane.base_url, scheduler=scheduler.url)


def _client(stack: Stack) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=stack.front, api_key="x", max_retries=0, timeout=300)


def _long_text(tag: str, chars: int) -> str:
    return f"Notes {tag}: " + FILLER * (chars // len(FILLER))


async def test_the_scheduler_reads_a_busy_replicas_load_and_kv_pool_from_vllms_metrics(
    stack: Stack,
) -> None:
    engine = AsyncOpenAI(base_url=stack.engine + "/v1", api_key="x", max_retries=0, timeout=300)

    async def generate(i: int) -> None:
        await engine.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": _long_text(f"load {i}", 2000)}],
            max_tokens=400,
            extra_body={"ignore_eos": True},
        )

    running = f'luftpause_replica_engine_running_requests{{replica="{REPLICA}"}}'
    pool = f'luftpause_replica_kv_pool_tokens{{replica="{REPLICA}"}}'
    used = f'luftpause_replica_kv_used_tokens{{replica="{REPLICA}"}}'
    busy = [asyncio.create_task(generate(i)) for i in range(4)]
    try:
        async with aiohttp.ClientSession() as http:
            seen = await eventually(
                lambda: read_metrics(stack.scheduler + "/metrics", http),
                lambda m: m.get(running, 0) >= 2 and m.get(used, 0) > 0,
                "the scheduler to see the replica's running requests and used KV",
                timeout=120,
                every=0.2,
            )
            async with http.get(stack.engine + "/metrics") as resp:
                engine_text = await resp.text()
    finally:
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)
        await engine.close()
    # The pool is what vLLM itself says it holds (its cache config's token count), which is
    # what the pool was started with.
    declared = re.search(r'vllm:cache_config_info\{[^}]*kv_cache_size_tokens="(\d+)"', engine_text)
    assert declared is not None, "vLLM no longer exports kv_cache_size_tokens"
    assert seen[pool] == int(declared[1]) == KV_TOKENS
    assert 0 < seen[used] < seen[pool]
    load = parse_load(engine_text)
    assert load is not None and load.kv_total == int(declared[1])


async def test_a_turn_through_the_dataplane_streams_the_tool_call_vllm_parsed(
    stack: Stack,
) -> None:
    # check_prompt() gives the chat messages as plain dicts (they also feed transformers' chat
    # template): the same messages, as the SDK's type.
    prompt = cast(list[ChatCompletionMessageParam], check_prompt())
    async with _client(stack) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=prompt,
            tools=LOOKUP_TOOL,
            max_tokens=40,
            temperature=0.0,
            stop=["</tool_call>"],
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-luftpause-run-id": "tool-turn"},
        )
        names, arguments, finishes, usages, chunks = [], [], [], [], 0
        async for chunk in stream:
            chunks += 1
            if chunk.usage is not None:
                usages.append(chunk.usage)
            for choice in chunk.choices:
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
                for call in choice.delta.tool_calls or ():
                    assert call.index == 0
                    if call.function is not None:
                        names.append(call.function.name or "")
                        arguments.append(call.function.arguments or "")
    assert chunks > 3, "the reply came in one piece, not streamed"
    assert "".join(names) == "lookup"
    assert isinstance(json.loads("".join(arguments)).get("query"), str)
    assert finishes == ["tool_calls"]
    assert len(usages) == 1 and usages[0].prompt_tokens > 300


async def test_a_repeated_prefix_comes_back_as_cached_tokens_streamed_or_not(
    stack: Stack,
) -> None:
    messages: list[Any] = [{"role": "user", "content": _long_text("cache", 5600)}]
    async with _client(stack) as client:
        first = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=1, extra_headers={"x-luftpause-run-id": "c"}
        )
        again = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=1, extra_headers={"x-luftpause-run-id": "c"}
        )
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=1,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-luftpause-run-id": "c"},
        )
        streamed = [chunk.usage async for chunk in stream if chunk.usage is not None]
    assert first.usage is not None and again.usage is not None and len(streamed) == 1
    prompt = first.usage.prompt_tokens
    assert prompt > 1000
    details = first.usage.prompt_tokens_details
    assert details is not None and (details.cached_tokens or 0) < prompt / 2
    # vLLM's CPU build caches whole blocks of 128 tokens, so the last partial block is read again.
    for usage in (again.usage, streamed[0]):
        assert usage.prompt_tokens == prompt
        assert usage.prompt_tokens_details is not None
        assert (usage.prompt_tokens_details.cached_tokens or 0) >= prompt - 128


async def test_the_openai_client_gets_a_clean_400_for_a_request_vllm_refuses(
    stack: Stack,
) -> None:
    too_long = [{"role": "user", "content": _long_text("long", 6 * MAX_MODEL_LEN)}]
    async with _client(stack) as client:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(
                    model=MODEL,
                    messages=too_long,  # type: ignore[arg-type]
                    max_tokens=8,
                    stream=stream,
                )
            assert caught.value.status_code == 400
            body = caught.value.body
            assert isinstance(body, dict) and "message" in body, body
            assert "context length" in body["message"] or str(MAX_MODEL_LEN) in body["message"]
        # The replica still serves after refusing.
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
        )
    assert reply.choices[0].message.content is not None
