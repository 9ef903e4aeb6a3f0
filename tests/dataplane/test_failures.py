"""Failure semantics of the turn path, row by row of the seed's table."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web

from luftpause.common.ratelimits import Budget, Reading
from luftpause.dataplane.proxy import refusal_wait
from luftpause.dataplane.runs import Phase
from tests.dataplane.conftest import Stack, closed_port
from tests.dataplane.fakes import MODEL, delta_chunk, sse


async def test_unknown_model_gets_404_with_the_schedulers_message(stack: Stack) -> None:
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(stack.chat(model="nope"))
    assert status == 404
    assert json.loads(data) == {"error": {"message": "no Generative replica serves model 'nope'"}}
    assert headers["x-luftpause-run-id"]
    assert stack.engine.seen == []


async def test_malformed_json_gets_400_with_a_run_id(stack: Stack) -> None:
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(
            b"{nope", **{"x-luftpause-run-id": "run-9", "Content-Type": "application/json"}
        )
    assert status == 400 and headers["x-luftpause-run-id"] == "run-9"
    assert "not valid JSON" in json.loads(data)["error"]["message"]
    assert stack.scheduler.admits == []


async def test_missing_messages_and_unknown_class_get_400(stack: Stack) -> None:
    async with asyncio.timeout(10):
        no_messages, headers, _ = await stack.post({"model": MODEL})
        bad_class, _, data = await stack.post(stack.chat(), **{"x-luftpause-class": "urgent"})
    assert no_messages == 400 and headers["x-luftpause-run-id"]
    assert bad_class == 400 and "x-luftpause-class" in json.loads(data)["error"]["message"]


async def test_body_over_the_limit_gets_413_json(stack: Stack) -> None:
    stack.dp.max_body_bytes = 100
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(stack.chat(pad="x" * 200))
    assert status == 413 and headers["x-luftpause-run-id"]
    assert "limit" in json.loads(data)["error"]["message"]


async def test_engine_refusing_connections_gets_502_naming_the_replica(stack: Stack) -> None:
    stack.scheduler.replica_url = f"http://127.0.0.1:{closed_port()}"
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(stack.chat())
        turn_id = stack.scheduler.admits[-1].turn_id
        events = await stack.turn_events(turn_id, 2)
    assert status == 502 and headers["x-luftpause-run-id"]
    assert json.loads(data)["error"]["message"].startswith("engine engine-a: ")
    assert events == ["started", "failed"]
    assert stack.dp.runs.phase(headers["x-luftpause-run-id"]) is Phase.IDLE


async def test_engine_429_it_cannot_wait_out_passes_through_with_retry_after(
    stack: Stack,
) -> None:
    body = b'{"error": {"message": "rate limited", "type": "rate_limit"}}'
    asked = 0

    async def limited(request: web.Request) -> web.Response:
        nonlocal asked
        asked += 1
        return web.Response(
            status=429,
            body=body,
            content_type="application/json",
            headers={"Retry-After": "120", "x-ratelimit-remaining-tokens": "0"},
        )

    stack.engine.handler = limited
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(stack.chat(stream=True))
        turn_id = stack.scheduler.admits[-1].turn_id
        events = await stack.turn_events(turn_id, 2)
    assert status == 429 and data == body and asked == 1  # 120 s is past the 30 s it may wait
    assert headers["Retry-After"] == "120" and headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["Content-Type"] == "application/json"
    assert headers["x-luftpause-run-id"]
    assert events == ["started", "failed"]


SPENT = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "300ms"}


def _limited_once(asked: list[float], headers: dict[str, str]) -> Any:
    """An engine handler that refuses the first request with a 429 and `headers`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        asked.append(asyncio.get_running_loop().time())
        if len(asked) == 1:
            return web.json_response(
                {"error": {"message": "slow down"}}, status=429, headers=headers
            )
        return web.json_response(
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        )

    return handler


async def test_engine_429_goes_back_to_the_scheduler_and_the_client_sees_only_the_reply(
    stack: Stack,
) -> None:
    """The refusal's reading goes up with the turn's end (the scheduler cools the window down
    and holds the next try); the turn is admitted again as a new turn of the same run."""
    asked: list[float] = []
    stack.engine.handler = _limited_once(asked, SPENT)
    async with asyncio.timeout(10):
        status, headers, data = await stack.post(stack.chat())
        first, second = stack.scheduler.admits[-2:]
        events = await stack.turn_events(first.turn_id, 2)
        await stack.turn_events(second.turn_id, 2)
        async with stack.http.get(stack.url + "/metrics") as resp:
            metrics = await resp.text()
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "ok"
    assert len(asked) == 2 and first.run_id == second.run_id == headers["x-luftpause-run-id"]
    assert events == ["started", "failed"]
    failed = next(
        e for e in stack.scheduler.events if e.turn_id == first.turn_id and e.failed.reason
    )
    reading = failed.failed.rate_limits
    assert reading.refused and reading.age_ms >= 0
    (budget,) = reading.budgets
    assert (budget.name, budget.remaining, round(budget.reset_seconds, 3)) == ("requests", 0, 0.3)
    assert stack.scheduler.events_of(second.turn_id) == ["started", "finished"]
    assert 'luftpause_dataplane_rate_limited_total{replica="engine-a"} 1.0' in metrics


async def test_engine_429_without_rate_limit_headers_is_waited_out_by_the_dataplane(
    stack: Stack,
) -> None:
    """A bare 429 tells the scheduler nothing: the dataplane waits (0.5 s) before it tries."""
    asked: list[float] = []
    stack.engine.handler = _limited_once(asked, {})
    async with asyncio.timeout(10):
        status, _, data = await stack.post(stack.chat())
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "ok"
    assert len(asked) == 2 and asked[1] - asked[0] >= 0.5


async def test_engine_429_with_a_reading_is_reported_with_the_turns_end(stack: Stack) -> None:
    """A reply's rate-limit headers go up with its end, dated by their age."""

    async def limited(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]},
            headers={
                "x-ratelimit-limit-tokens": "1000",
                "x-ratelimit-remaining-tokens": "750",
                "x-ratelimit-reset-tokens": "6m0s",
            },
        )

    stack.engine.handler = limited
    async with asyncio.timeout(10):
        status, _, _ = await stack.post(stack.chat())
        turn_id = stack.scheduler.admits[-1].turn_id
        await stack.turn_events(turn_id, 2)
    finished = next(
        e for e in stack.scheduler.events if e.turn_id == turn_id and e.HasField("finished")
    )
    (budget,) = finished.finished.rate_limits.budgets
    assert status == 200 and not finished.finished.rate_limits.refused
    assert (budget.name, budget.limit, budget.remaining, budget.reset_seconds) == (
        "tokens",
        1000,
        750,
        360.0,
    )


async def test_engine_500_passes_through_unchanged(stack: Stack) -> None:
    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=503, text="overloaded")

    stack.engine.handler = broken
    async with asyncio.timeout(10):
        status, _, data = await stack.post(stack.chat())
    assert status == 503 and data == b"overloaded"


async def raw_request(
    stack: Stack, body: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = stack.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: dp\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    return reader, writer


async def test_client_leaving_while_held_cancels_admit_and_no_engine_request_is_made(
    stack: Stack,
) -> None:
    stack.scheduler.hold = True
    async with asyncio.timeout(10):
        _, writer = await raw_request(stack, json.dumps(stack.chat()).encode())
        await stack.scheduler.changes.until(lambda: len(stack.scheduler.admits) == 1)
        writer.close()
        await writer.wait_closed()
        turn_id = stack.scheduler.admits[0].turn_id
        await stack.scheduler.changes.until(lambda: stack.scheduler.admits_cancelled == [turn_id])
        events = await stack.turn_events(turn_id, 1)
    assert events == ["abandoned"]
    assert stack.engine.seen == []
    assert stack.dp.runs.turns == {}


async def test_client_leaving_mid_stream_closes_the_engine_connection(stack: Stack) -> None:
    first = sse(delta_chunk({"content": "a"}), done=False)[0]

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(first)
        await asyncio.Event().wait()  # until the dataplane hangs up
        return resp

    stack.engine.handler = slow
    async with asyncio.timeout(10):
        async with aiohttp.ClientSession() as http:
            resp = await http.post(stack.url + "/v1/chat/completions", json=stack.chat(stream=True))
            assert await resp.content.readany() == first
            resp.close()
        await stack.engine.changes.until(lambda: stack.engine.disconnects == 1)
        turn_id = stack.scheduler.admits[-1].turn_id
        events = await stack.turn_events(turn_id, 3)
    assert events == ["started", "first_token", "failed"]


async def test_engine_breaking_mid_stream_cuts_the_client_off_without_done(stack: Stack) -> None:
    sent = sse(delta_chunk({"content": "a"}), delta_chunk({"content": "b"}), done=False)

    async def breaks(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in sent:
            await resp.write(chunk)
        assert request.transport is not None
        request.transport.close()
        return resp

    stack.engine.handler = breaks
    async with asyncio.timeout(10):
        received, cut_off = await stack.read_cut("/v1/chat/completions", stack.chat(stream=True))
        turn_id = stack.scheduler.admits[-1].turn_id
        events = await stack.turn_events(turn_id, 3)
    assert cut_off and received == b"".join(sent)
    assert events == ["started", "first_token", "failed"]


def test_how_long_a_refusal_is_waited_out() -> None:
    spent = Reading(budgets={"tokens": Budget(remaining=0, reset_s=4.0)})
    left = Reading(budgets={"tokens": Budget(remaining=10, reset_s=9.0)})
    assert refusal_wait(200, None, 0) is None
    assert refusal_wait(503, Reading(retry_after_s=1.0), 0) is None  # not a rate limit
    assert refusal_wait(429, Reading(retry_after_s=3.0), 0) == 3.0
    assert refusal_wait(429, Reading(retry_after_s=0.0), 0) == 0.1  # never a tight loop
    assert refusal_wait(429, spent, 0) == 4.0
    assert [refusal_wait(429, left, n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert refusal_wait(429, None, 1) == 1.0
