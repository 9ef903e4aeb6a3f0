"""The Messages and Responses doors on the turn path: passed or translated per replica, the run
recognised by its echoed ids, and every failure in the client's API's error shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from luftpause.dataplane.apis import Api
from luftpause.dataplane.context import Served
from luftpause.dataplane.runs import Phase
from tests.dataplane.conftest import ENGINE_KEY, Stack, closed_port, running_stack
from tests.dataplane.fakes import MODEL, TEXT_STREAM, TOOL_STREAM

MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
CLAUDE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    "x-api-key": "client-key",
}


def anthropic(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    return {**body, **extra}


def codex(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "hi", "stream": True, "store": False, **extra}


def frames(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in data.split(b"\n") if line.startswith(b"data: ")]


@pytest.fixture
async def native() -> AsyncIterator[Stack]:
    """A replica serving all three APIs itself, its key in Anthropic's header."""
    served = {"engine-a": Served(apis=frozenset(Api), key_header="x-api-key")}
    async with running_stack(served=served) as s:
        yield s


async def test_a_messages_turn_to_a_chat_engine_is_translated_both_ways(stack: Stack) -> None:
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(
            anthropic(), MESSAGES + "?beta=true", **CLAUDE_HEADERS
        )
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    seen = stack.engine.seen[-1]
    assert (seen.path, seen.query) == ("/v1/chat/completions", "")
    sent = json.loads(seen.body)
    assert sent["messages"] == [{"role": "user", "content": "hi"}]
    assert sent["stream_options"] == {"include_usage": True}
    events = frames(data)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "Hello world"
    # The client's key is for luftpause only; the engine gets its own.
    assert "x-api-key" not in {k.lower() for k in seen.headers}
    assert seen.headers["Authorization"] == f"Bearer {ENGINE_KEY}"


async def test_a_messages_turn_to_an_engine_serving_it_goes_and_comes_back_unchanged(
    native: Stack,
) -> None:
    reply = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_x",'
        b'"usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"tool_use","id":"toolu_9","name":"f","input":{}}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"tool_use"},'
        b'"usage":{"output_tokens":4}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    native.engine.chunks = [reply[:50], reply[50:]]
    body = json.dumps(anthropic(thinking={"type": "adaptive"})).encode()
    async with asyncio.timeout(10):
        status, headers, data = await native.post(body, MESSAGES + "?beta=true", **CLAUDE_HEADERS)
        events = await native.turn_events(native.scheduler.admits[-1].turn_id, 3)
    assert status == 200 and data == reply
    seen = native.engine.seen[-1]
    assert (seen.path, seen.query, seen.body) == (MESSAGES, "beta=true", body)
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["anthropic-beta"] == CLAUDE_HEADERS["anthropic-beta"]
    assert seen.headers["x-api-key"] == ENGINE_KEY and "Authorization" not in seen.headers
    assert events == ["started", "first_token", "finished"]
    run_id = headers["x-luftpause-run-id"]
    assert native.dp.runs.phase(run_id) is Phase.TOOL_PAUSED
    assert native.dp.memory.recognise(["toolu_9"], native.dp.clock()) == run_id


async def test_a_run_without_a_header_is_recognised_by_the_tool_use_ids_it_echoes(
    stack: Stack,
) -> None:
    stack.engine.chunks = list(TOOL_STREAM)
    async with asyncio.timeout(10):
        _, first, data = await stack.post(anthropic(), MESSAGES)
        call = next(e for e in frames(data) if e["type"] == "content_block_start")
        assert call["content_block"]["id"] == "call_abc"
        follow = anthropic(
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [call["content_block"]]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "call_abc", "content": "x"}],
                },
            ]
        )
        _, second, _ = await stack.post(follow, MESSAGES)
    assert second["x-luftpause-run-id"] == first["x-luftpause-run-id"]
    assert json.loads(stack.engine.seen[-1].body)["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_abc",
        "content": "x",
    }


async def test_a_codex_run_is_recognised_by_the_call_ids_of_its_tool_outputs(stack: Stack) -> None:
    stack.engine.chunks = list(TOOL_STREAM)
    async with asyncio.timeout(10):
        _, first, data = await stack.post(codex(), RESPONSES)
        done = [e["item"] for e in frames(data) if e["type"] == "response.output_item.done"]
        follow = codex(
            input=[
                {"role": "user", "content": "hi"},
                {
                    "type": "function_call",
                    "call_id": done[0]["call_id"],
                    "name": "lookup",
                    "arguments": "{}",
                },
                {"type": "function_call_output", "call_id": done[0]["call_id"], "output": "ok"},
            ]
        )
        _, second, _ = await stack.post(follow, RESPONSES)
    assert done[0]["call_id"] == "call_abc"
    assert second["x-luftpause-run-id"] == first["x-luftpause-run-id"]
    assert stack.engine.seen[-1].path == "/v1/chat/completions"


async def test_a_responses_turn_to_an_engine_serving_it_is_passed_unchanged(native: Stack) -> None:
    body = json.dumps(codex(reasoning={"summary": "auto"})).encode()
    async with asyncio.timeout(10):
        status, _, data = await native.post(body, RESPONSES, Authorization="Bearer codex")
    assert status == 200 and data == b"".join(native.engine.chunks)
    assert native.engine.seen[-1].path == RESPONSES and native.engine.seen[-1].body == body


async def test_a_non_stream_messages_turn_gets_one_message(stack: Stack) -> None:
    async def whole(request: web.Request) -> web.Response:
        completion = {
            "id": "chatcmpl-2",
            "created": 1,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hi."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        }
        return web.json_response(completion)

    stack.engine.handler = whole
    async with asyncio.timeout(10):
        status, _, data = await stack.post(anthropic(stream=False), MESSAGES)
    message = json.loads(data)
    assert status == 200 and message["type"] == "message"
    assert message["content"] == [{"type": "text", "text": "Hi."}]
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["input_tokens"] == 3 and message["usage"]["output_tokens"] == 2


async def test_failures_of_a_messages_turn_come_in_anthropics_error_shape(stack: Stack) -> None:
    async with asyncio.timeout(10):
        unknown = await stack.post(anthropic(model="nope"), MESSAGES)
        malformed = await stack.post(b"{nope", MESSAGES, **{"Content-Type": "application/json"})
        no_max = await stack.post(
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, MESSAGES
        )
    assert unknown[0] == 404
    assert json.loads(unknown[2]) == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "no Generative replica serves model 'nope'",
        },
    }
    assert (
        malformed[0] == 400 and json.loads(malformed[2])["error"]["type"] == "invalid_request_error"
    )
    assert no_max[0] == 400 and "max_tokens" in json.loads(no_max[2])["error"]["message"]
    assert all(r[1]["x-luftpause-run-id"] for r in (unknown, malformed, no_max))
    stack.scheduler.replica_url = f"http://127.0.0.1:{closed_port()}"
    async with asyncio.timeout(10):
        status, _, data = await stack.post(anthropic(), MESSAGES)
    assert status == 502 and json.loads(data)["error"]["type"] == "api_error"
    assert json.loads(data)["error"]["message"].startswith("engine engine-a: ")


async def test_an_engine_refusal_keeps_its_status_and_retry_after_in_the_clients_shape(
    stack: Stack,
) -> None:
    async def overloaded(request: web.Request) -> web.Response:
        body = {"error": {"message": "engine is restarting", "type": "server_error"}}
        return web.json_response(body, status=503, headers={"Retry-After": "7"})

    stack.engine.handler = overloaded
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(anthropic(), MESSAGES)
        r_status, _, r_data = await stack.post(codex(), RESPONSES)
    assert status == 503 and headers["Retry-After"] == "7"
    assert json.loads(data) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "engine is restarting"},
    }
    assert r_status == 503 and json.loads(r_data) == {"error": {"message": "engine is restarting"}}


async def test_a_request_an_engine_cannot_take_in_chat_is_refused_as_bad_and_frees_its_turn(
    stack: Stack,
) -> None:
    pdf = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "JV"},
    }
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(
            anthropic(messages=[{"role": "user", "content": [pdf]}]), MESSAGES
        )
        events = await stack.turn_events(stack.scheduler.admits[-1].turn_id, 1)
    assert status == 400 and "only text documents" in json.loads(data)["error"]["message"]
    assert events == ["failed"] and stack.engine.seen == []
    assert stack.dp.runs.phase(headers["x-luftpause-run-id"]) is Phase.IDLE


async def test_a_replica_serving_neither_the_api_nor_chat_refuses_with_502() -> None:
    served = {"engine-a": Served(apis=frozenset({Api.MESSAGES}))}
    async with running_stack(served=served) as stack, asyncio.timeout(10):
        status, _, data = await stack.post(codex(), RESPONSES)
    assert (
        status == 502
        and "serves neither the Responses API nor Chat Completions"
        in json.loads(data)["error"]["message"]
    )


async def test_the_api_key_of_an_anthropic_client_is_its_bearer_and_a_wrong_one_401s() -> None:
    async with running_stack(token=b"s3cret") as stack, asyncio.timeout(10):
        ok = await stack.post(anthropic(), MESSAGES, **{"x-api-key": "s3cret"})
        wrong = await stack.post(anthropic(), MESSAGES, **{"x-api-key": "nope"})
    assert ok[0] == 200
    assert wrong[0] == 401 and json.loads(wrong[2])["error"]["type"] == "authentication_error"


async def test_token_counts_are_estimated_for_a_chat_engine_and_asked_of_a_native_one(
    stack: Stack,
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 400}]}
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(body, "/v1/messages/count_tokens")
    assert status == 200 and headers["x-luftpause-token-count"] == "estimate"
    assert 100 <= json.loads(data)["input_tokens"] <= 130
    assert stack.engine.seen == [] and stack.scheduler.admits == []

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"input_tokens": 123})

    async with running_stack() as native, asyncio.timeout(10):
        # The engine's URL is known once it runs: the endpoint file's facts are set then.
        facts = Served(apis=frozenset(Api), url=native.engine_url, models=frozenset({MODEL}))
        native.dp.served = {"engine-a": facts}
        native.engine.handler = count
        status, headers, data = await native.post(
            body, "/v1/messages/count_tokens", **CLAUDE_HEADERS
        )
    assert status == 200 and json.loads(data) == {"input_tokens": 123}
    assert headers["x-luftpause-token-count"] == "engine"
    assert native.engine.seen[-1].path == "/v1/messages/count_tokens"
    assert native.engine.seen[-1].headers["anthropic-version"] == "2023-06-01"


async def test_a_messages_turn_over_the_body_limit_gets_anthropics_413(stack: Stack) -> None:
    stack.dp.max_body_bytes = 100
    async with asyncio.timeout(10):
        status, _, data = await stack.post(anthropic(pad="x" * 200), MESSAGES)
    assert status == 413 and json.loads(data)["error"]["type"] == "request_too_large"


async def test_translated_and_passed_turns_are_counted_by_api(stack: Stack) -> None:
    async with asyncio.timeout(10):
        await stack.post(anthropic(), MESSAGES)
        await stack.post(codex(), RESPONSES)
        await stack.post(stack.chat())
        async with stack.http.get(stack.url + "/metrics") as resp:
            text = await resp.text()
    for api, path in (("messages", "translated"), ("responses", "translated"), ("chat", "passed")):
        assert f'luftpause_dataplane_api_turns_total{{api="{api}",path="{path}"}} 1.0' in text


async def test_an_engine_breaking_off_a_translated_stream_leaves_it_without_message_stop(
    stack: Stack,
) -> None:
    async def broken(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in TEXT_STREAM[:2]:  # the role chunk and the first text, then it dies
            await resp.write(chunk)
        assert request.transport is not None
        request.transport.close()
        return resp

    stack.engine.handler = broken
    async with asyncio.timeout(10):
        received, cut_off = await stack.read_cut(MESSAGES, anthropic())
        events = await stack.turn_events(stack.scheduler.admits[-1].turn_id, 3)
    kinds = [e["type"] for e in frames(received)]
    assert cut_off and kinds[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert "message_stop" not in kinds
    assert events == ["started", "first_token", "failed"]


# A reply's tool calls are known before the engine ends its stream: a client reads the last
# event and sends its next turn at once (Codex does), often before the engine's end of stream
# reaches the dataplane. That turn echoes the calls' ids and must find its run.

RESPONSES_TOOL_STREAM = [
    b"event: response.created\n"
    b'data: {"type":"response.created","response":{"id":"resp_1","status":"in_progress",'
    b'"output":[]}}\n\n',
    b"event: response.output_item.added\n"
    b'data: {"type":"response.output_item.added","output_index":0,"item":{"type":'
    b'"function_call","id":"fc_1","call_id":"call_rsp","name":"lookup","arguments":""}}\n\n',
    b"event: response.completed\n"
    b'data: {"type":"response.completed","response":{"id":"resp_1","status":"completed",'
    b'"output":[{"type":"function_call","id":"fc_1","call_id":"call_rsp","name":"lookup",'
    b'"arguments":"{}"}],"usage":{"input_tokens":5,"output_tokens":3,"total_tokens":8}}}\n\n',
]


def _ends_late(chunks: list[bytes], released: asyncio.Event) -> Any:
    """An engine handler that sends `chunks`, then holds its stream open until `released`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)
        await released.wait()
        await resp.write_eof()
        return resp

    return handler


@pytest.mark.parametrize(
    ("door", "path", "engine_stream", "last", "call_id"),
    [
        ("chat passed", "/v1/chat/completions", TOOL_STREAM, b"[DONE]", "call_abc"),
        ("responses translated", RESPONSES, TOOL_STREAM, b"response.completed", "call_abc"),
        ("responses passed", RESPONSES, RESPONSES_TOOL_STREAM, b"response.completed", "call_rsp"),
    ],
)
async def test_a_streamed_replys_tool_calls_find_their_run_before_the_engine_ends_its_stream(
    stack: Stack,
    native: Stack,
    door: str,
    path: str,
    engine_stream: list[bytes],
    last: bytes,
    call_id: str,
) -> None:
    s = native if door == "responses passed" else stack
    released = asyncio.Event()
    s.engine.handler = _ends_late(engine_stream, released)
    body = codex() if path == RESPONSES else s.chat(stream=True)
    async with asyncio.timeout(10), s.http.post(s.url + path, json=body) as resp:
        assert resp.status == 200
        run_id = resp.headers["x-luftpause-run-id"]
        got = b""
        while last not in got:
            got += await resp.content.readany()
        # The client holds the reply's last event; the engine has not ended its stream.
        assert s.dp.memory.recognise([call_id], s.dp.clock()) == run_id
        released.set()
        await resp.read()
