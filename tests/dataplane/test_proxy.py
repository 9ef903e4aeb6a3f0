"""Turns through a real dataplane to a fake scheduler and a tiny aiohttp engine."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from openai import AsyncOpenAI

from luftpause.dataplane.runs import Phase
from luftpause.rpc import scheduler_pb2 as pb
from tests.dataplane.conftest import ENGINE_KEY, Stack
from tests.dataplane.fakes import MODEL, TEXT_STREAM, TOOL_STREAM


def openai_client(stack: Stack, **headers: str) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=stack.url + "/v1", api_key="x", max_retries=0, default_headers=headers
    )


def last_finished(stack: Stack, turn_id: str) -> pb.TurnFinished:
    return next(
        e.finished
        for e in stack.scheduler.events
        if e.turn_id == turn_id and e.WhichOneof("kind") == "finished"
    )


async def test_stream_reaches_the_openai_client_byte_for_byte(stack: Stack) -> None:
    async with (
        asyncio.timeout(10),
        openai_client(stack) as client,
        client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        ) as resp,
    ):
        data = b"".join([chunk async for chunk in resp.iter_bytes()])
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-luftpause-run-id"]
    assert data == b"".join(TEXT_STREAM)


async def test_openai_client_reads_the_proxied_stream_as_chunks(stack: Stack) -> None:
    async with asyncio.timeout(10), openai_client(stack) as client:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello world"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 12


async def test_stream_turn_reports_started_first_token_finished_with_usage(stack: Stack) -> None:
    async with asyncio.timeout(10):
        status, headers, _ = await stack.post(
            stack.chat(stream=True),
            **{
                "x-luftpause-run-id": "run-7",
                "x-luftpause-class": "batch",
                "x-luftpause-caller": "me",
            },
        )
        admit = stack.scheduler.admits[-1]
        events = await stack.turn_events(admit.turn_id, 3)
    assert status == 200 and headers["x-luftpause-run-id"] == "run-7"
    assert (admit.run_id, admit.model, admit.caller, admit.dataplane_id) == (
        "run-7",
        MODEL,
        "me",
        "dp-test",
    )
    assert admit.service_class == pb.SERVICE_CLASS_BATCH
    assert events == ["started", "first_token", "finished"]
    finished = last_finished(stack, admit.turn_id)
    assert finished.finish_reason == "stop" and not finished.tool_calls
    assert (
        finished.usage.prompt_tokens,
        finished.usage.completion_tokens,
        finished.usage.cached_tokens,
    ) == (12, 2, 8)
    assert stack.dp.runs.phase("run-7") is Phase.IDLE


async def test_tool_call_reply_pauses_the_run_and_its_echoed_id_finds_it_again(
    stack: Stack,
) -> None:
    stack.engine.chunks = list(TOOL_STREAM)
    async with asyncio.timeout(10):
        _, headers, _ = await stack.post(stack.chat(stream=True))
        run_id = headers["x-luftpause-run-id"]
        first = stack.scheduler.admits[-1]
        await stack.turn_events(first.turn_id, 3)
        assert last_finished(stack, first.turn_id).tool_calls
        assert stack.dp.runs.phase(run_id) is Phase.TOOL_PAUSED

        stack.engine.chunks = list(TEXT_STREAM)
        follow_up = stack.chat(
            stream=True,
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "call_abc",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_abc", "content": "42"},
            ],
        )
        _, again, _ = await stack.post(follow_up)
    assert again["x-luftpause-run-id"] == run_id
    assert stack.scheduler.admits[-1].run_id == run_id


async def test_request_without_header_or_known_tool_ids_starts_a_new_run(stack: Stack) -> None:
    async with asyncio.timeout(10):
        _, first, _ = await stack.post(stack.chat())
        _, second, _ = await stack.post(stack.chat())
    assert first["x-luftpause-run-id"] != second["x-luftpause-run-id"]


async def test_non_stream_reply_is_forwarded_unchanged_and_reported(stack: Stack) -> None:
    body = json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "call_x",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4},
        },
        indent=1,
    ).encode()

    async def reply(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    stack.engine.handler = reply
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(stack.chat())
        turn_id = stack.scheduler.admits[-1].turn_id
        events = await stack.turn_events(turn_id, 2)
    assert status == 200 and data == body
    assert events == ["started", "finished"]
    finished = last_finished(stack, turn_id)
    assert finished.tool_calls and finished.usage.completion_tokens == 4
    assert stack.dp.runs.phase(headers["x-luftpause-run-id"]) is Phase.TOOL_PAUSED
    assert stack.dp.memory.recognise(["call_x"], stack.dp.clock()) == headers["x-luftpause-run-id"]


async def test_client_body_goes_upstream_byte_for_byte(stack: Stack) -> None:
    raw = b'{"model":"sim-model" ,  "messages":[{"role":"user","content":"x"}],"stream":true}'
    async with asyncio.timeout(10):
        status, _, _ = await stack.post(raw, **{"Content-Type": "application/json"})
    assert status == 200 and stack.engine.seen[-1].body == raw


async def test_client_authorization_stays_and_configured_key_goes_upstream(stack: Stack) -> None:
    async with asyncio.timeout(10):
        await stack.post(
            stack.chat(),
            **{
                "Authorization": "Bearer client-secret",
                "x-luftpause-caller": "me",
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            },
        )
    seen = {k.lower(): v for k, v in stack.engine.seen[-1].headers.items()}
    assert seen["authorization"] == f"Bearer {ENGINE_KEY}"
    assert not [k for k in seen if k.startswith("x-luftpause-")]
    assert seen["traceparent"].startswith("00-0af7")
    assert seen["host"] == stack.engine_url.removeprefix("http://")


async def test_replica_without_a_configured_key_gets_no_authorization(stack: Stack) -> None:
    stack.scheduler.replica_id = "engine-b"
    async with asyncio.timeout(10):
        await stack.post(stack.chat(), Authorization="Bearer client-secret")
    assert "authorization" not in {k.lower() for k in stack.engine.seen[-1].headers}
