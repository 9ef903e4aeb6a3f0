"""The turn path end to end: the official openai client -> dataplane -> scheduler -> engine.

Every process is real and talks over loopback; the engines are the simulator.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from luftpause.testkit.stack import SIM_MODEL, LocalStack
from luftpause.testkit.status import fetch_status

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOOLS: list[Any] = [
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


def client(stack: LocalStack, **headers: str) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=stack.base_url, api_key="x", max_retries=0, timeout=30, default_headers=headers
    )


async def status(stack: LocalStack) -> dict[str, Any]:
    return await fetch_status(stack.status_url)


async def test_openai_client_streams_a_completion_through_the_dataplane(stack: LocalStack) -> None:
    async with asyncio.timeout(30), client(stack) as c:
        stream = await c.chat.completions.create(
            model=SIM_MODEL,
            messages=[{"role": "user", "content": "Tell me about rivers."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert len(chunks) > 3 and text.strip()
    assert finish[-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert chunks[0].system_fingerprint in {"engine-0", "engine-1"}


async def test_non_stream_completion_carries_the_run_id_header(stack: LocalStack) -> None:
    async with asyncio.timeout(30), client(stack) as c:
        raw = await c.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=[{"role": "user", "content": "hello"}]
        )
    reply = raw.parse()
    assert raw.headers["x-luftpause-run-id"]
    assert reply.choices[0].message.content and reply.usage is not None


async def _tool_run(c: AsyncOpenAI, task: str) -> tuple[list[str], list[str]]:
    """Drive one agent run to its final answer; return fingerprints and run ids per turn."""
    messages: list[Any] = [{"role": "user", "content": task}]
    fingerprints, run_ids = [], []
    for _ in range(6):
        raw = await c.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=messages, tools=TOOLS
        )
        reply = raw.parse()
        fingerprints.append(reply.system_fingerprint or "")
        run_ids.append(raw.headers["x-luftpause-run-id"])
        message = reply.choices[0].message
        if not message.tool_calls:
            return fingerprints, run_ids
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "42 km"})
    raise AssertionError("the run never gave a final answer")


async def test_three_turn_tool_calling_run_stays_on_one_replica(stack: LocalStack) -> None:
    async with asyncio.timeout(60), client(stack, **{"x-luftpause-run-id": "run-affine"}) as c:
        fingerprints, run_ids = await _tool_run(c, "How long is the Danube?")
    assert len(fingerprints) == 3
    assert len(set(fingerprints)) == 1
    assert set(run_ids) == {"run-affine"}


async def test_run_is_recognised_by_echoed_tool_call_ids_without_a_header(
    stack: LocalStack,
) -> None:
    async with asyncio.timeout(60), client(stack) as c:
        fingerprints, run_ids = await _tool_run(c, "How long is the Rhine?")
    assert len(fingerprints) == 3 and len(set(fingerprints)) == 1
    assert len(set(run_ids)) == 1


async def test_unknown_model_gets_404_with_a_json_error(stack: LocalStack) -> None:
    async with asyncio.timeout(10), client(stack) as c:
        with pytest.raises(openai.NotFoundError) as err:
            await c.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}]
            )
    assert err.value.status_code == 404
    body = err.value.response.json()
    assert body == {"error": {"message": "no Generative replica serves model 'no-such-model'"}}
    assert err.value.response.headers["x-luftpause-run-id"]


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"model": "luftpause-sim"}',
        b'{"model": "luftpause-sim", "messages": []}',
        b'{"messages": [{"role": "user", "content": "x"}]}',
    ],
)
async def test_bad_body_gets_400_with_a_json_error(stack: LocalStack, body: bytes) -> None:
    headers = {"Content-Type": "application/json"}
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as s,
        s.post(stack.base_url + "/chat/completions", data=body, headers=headers) as resp,
    ):
        assert resp.status == 400
        payload = json.loads(await resp.read())
    assert isinstance(payload["error"]["message"], str) and payload["error"]["message"]


async def test_fifty_concurrent_runs_finish_without_error(stack: LocalStack) -> None:
    async def one(i: int) -> list[str]:
        async with client(
            stack, **{"x-luftpause-run-id": f"many-{i}", "x-luftpause-caller": f"caller-{i % 5}"}
        ) as c:
            fingerprints, _ = await _tool_run(c, f"Question {i} about lakes")
            return fingerprints

    async with asyncio.timeout(90):
        results = await asyncio.gather(*(one(i) for i in range(50)))
    assert all(len(f) == 3 and len(set(f)) == 1 for f in results)
    # The last turn's end reaches the scheduler on the Report stream just after its client
    # has the whole reply: wait for it rather than race it.
    await stack.until(
        lambda st: st["turns_in_flight"] == 0 and st["held_total"] == 0,
        "the scheduler to see every turn of the fifty runs over",
    )


async def test_models_are_listed_from_the_scheduler(stack: LocalStack) -> None:
    async with asyncio.timeout(10), client(stack) as c:
        models = await c.models.list()
    assert [m.id for m in models.data] == [SIM_MODEL]


async def _metric(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        text = await resp.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def test_runs_on_open_engines_are_placed_by_the_dataplane_and_counted_by_the_scheduler(
    stack: LocalStack,
) -> None:
    dp_metrics = stack.base_url.removesuffix("/v1") + "/metrics"
    sched_metrics = stack.status_url.removesuffix("/status") + "/metrics"
    before = await _metric(dp_metrics, "luftpause_dataplane_placed_locally_total")
    reported = await _metric(sched_metrics, "luftpause_turns_placed_by_dataplane_total")
    st = await status(stack)
    assert all(r["open"] for r in st["replicas"]) and st["turns_in_flight"] == 0
    async with asyncio.timeout(60), client(stack) as c:
        # Fresh runs (no run id): the first turn of each is placed by the dataplane, spread
        # over both engines by its own turns in flight; the continuations follow their run.
        results = await asyncio.gather(*(_tool_run(c, f"Lake {i}?") for i in range(6)))
    assert all(len(f) == 3 and len(set(f)) == 1 for f, _ in results)
    assert {f[0] for f, _ in results} == {"engine-0", "engine-1"}
    placed = await _metric(dp_metrics, "luftpause_dataplane_placed_locally_total") - before
    assert placed == 18
    st = await stack.until(
        lambda s: s["turns_in_flight"] == 0 and s["held_total"] == 0,
        "the scheduler to see every turn of the six runs over",
    )
    assert await _metric(sched_metrics, "luftpause_turns_placed_by_dataplane_total") == (
        reported + 18
    )
    assert all(r["in_flight"] == 0 for r in st["replicas"])
