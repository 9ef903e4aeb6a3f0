"""Routes besides the turn path, and errors that are always JSON."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from multidict import CIMultiDict

from luftpause.dataplane.errors import EngineUnreachable
from tests.dataplane.conftest import Stack, running_stack
from tests.dataplane.fakes import MemoryResponse, MemoryTransport, delta_chunk, sse


async def test_health_answers_ok(stack: Stack) -> None:
    async with asyncio.timeout(10), stack.http.get(stack.url + "/health") as resp:
        assert resp.status == 200 and await resp.json() == {"status": "ok"}


async def test_unknown_route_is_a_json_404(stack: Stack) -> None:
    async with asyncio.timeout(10), stack.http.get(stack.url + "/v1/nothing") as resp:
        body = await resp.json()
    assert resp.status == 404 and body == {"error": {"message": "no route for /v1/nothing"}}


async def test_wrong_method_is_a_json_405_with_allow(stack: Stack) -> None:
    async with asyncio.timeout(10), stack.http.get(stack.url + "/v1/chat/completions") as resp:
        body = await resp.json()
    assert resp.status == 405 and resp.headers["Allow"] == "POST"
    assert "not allowed" in body["error"]["message"]


async def test_metrics_count_turns_bytes_and_time_to_first_byte(stack: Stack) -> None:
    async with asyncio.timeout(10):
        await stack.post(stack.chat(stream=True), **{"x-luftpause-class": "batch"})
        async with stack.http.get(stack.url + "/metrics") as resp:
            text = await resp.text()
    assert resp.status == 200
    assert 'luftpause_dataplane_turns_total{outcome="finished",service_class="batch"} 1.0' in text
    assert 'luftpause_dataplane_proxied_bytes_total{direction="response"}' in text
    assert 'luftpause_dataplane_time_to_first_byte_seconds_count{service_class="batch"} 1.0' in text


async def test_unexpected_error_is_a_json_500_and_the_turn_fails() -> None:
    def explode(url: str, headers: object, body: bytes) -> MemoryResponse:
        raise RuntimeError("bug")

    async with running_stack(lambda: MemoryTransport(explode)) as stack, asyncio.timeout(10):
        status, _, data = await stack.post(stack.chat())
        events = await stack.turn_events(stack.scheduler.admits[-1].turn_id, 2)
    assert status == 500
    assert json.loads(data) == {"error": {"message": "internal error in the dataplane"}}
    assert events == ["started", "failed"]


async def test_in_memory_engine_breaking_mid_stream_fails_the_turn() -> None:
    chunks = sse(delta_chunk({"content": "a"}), delta_chunk({"content": "b"}), done=False)
    transport = MemoryTransport(lambda *_: MemoryResponse(chunks=list(chunks), break_after=2))
    async with running_stack(lambda: transport) as stack, asyncio.timeout(10):
        async with stack.http.post(
            stack.url + "/v1/chat/completions", json=stack.chat(stream=True)
        ) as resp:
            received = b""
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in resp.content.iter_any():
                    received += chunk
        events = await stack.turn_events(stack.scheduler.admits[-1].turn_id, 3)
    assert received == b"".join(chunks)
    assert events == ["started", "first_token", "failed"]
    assert transport.responses[0].closed


async def test_in_memory_engine_sees_the_upstream_url_and_configured_key() -> None:
    transport = MemoryTransport(
        lambda *_: MemoryResponse(
            headers=CIMultiDict({"Content-Type": "application/json"}), chunks=[b"{}"]
        )
    )
    async with running_stack(lambda: transport) as stack, asyncio.timeout(10):
        stack.scheduler.replica_url = "http://engine.example:30000/"
        status, _, data = await stack.post(stack.chat())
    url, headers, _ = transport.sent[0]
    assert status == 200 and data == b"{}"
    assert url == "http://engine.example:30000/v1/chat/completions"
    assert headers["Authorization"] == "Bearer engine-secret"


async def test_unreachable_error_names_the_replica_and_the_cause() -> None:
    def refuse(url: str, headers: object, body: bytes) -> MemoryResponse:
        raise EngineUnreachable("Connect call failed")

    async with running_stack(lambda: MemoryTransport(refuse)) as stack, asyncio.timeout(10):
        status, _, data = await stack.post(stack.chat())
    assert status == 502
    assert json.loads(data) == {"error": {"message": "engine engine-a: Connect call failed"}}
