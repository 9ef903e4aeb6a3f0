"""`POST /v1/decide` through the app, against the fake scheduler and an in-memory engine."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from typing import Any

import pytest
from multidict import CIMultiDict

from luftpause.dataplane.errors import EngineUnreachable
from tests.dataplane.conftest import ENGINE_KEY, Stack, running_stack
from tests.dataplane.fakes import MODEL, MemoryResponse, MemoryTransport

JSON = CIMultiDict({"Content-Type": "application/json"})
CLASSIFY_REPLY = json.dumps(
    {
        "id": "classify-1",
        "object": "list",
        "model": "clf",
        "data": [{"index": 0, "label": "urgent", "probs": [0.9, 0.1], "num_classes": 2}],
        "usage": {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0},
    }
).encode()


def json_reply(
    doc: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> MemoryResponse:
    return MemoryResponse(
        status=status,
        headers=CIMultiDict({"Content-Type": "application/json", **(headers or {})}),
        chunks=[json.dumps(doc).encode() if not isinstance(doc, bytes) else doc],
    )


def logprob_reply(top: Mapping[str, float]) -> dict[str, Any]:
    first = {
        "token": next(iter(top)),
        "logprob": math.log(next(iter(top.values()))),
        "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in top.items()],
    }
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": first["token"]},
                "logprobs": {"content": [first]},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 1, "total_tokens": 31},
    }


async def decide(stack: Stack, body: Any, **headers: str) -> tuple[int, dict[str, str], bytes]:
    kwargs: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with stack.http.post(stack.url + "/v1/decide", headers=headers, **kwargs) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def test_classify_goes_single_pass_to_the_replicas_classify_unchanged() -> None:
    transport = MemoryTransport(lambda *_: json_reply(CLASSIFY_REPLY, headers={"x-engine": "e"}))
    raw = b'{"model": "sim-model",  "input": ["the pager rings"], "truncate_prompt_tokens": 5}'
    async with running_stack(lambda: transport) as stack, asyncio.timeout(10):
        status, headers, data = await decide(
            stack, raw, **{"x-luftpause-caller": "alice", "x-luftpause-run-id": "run-7"}
        )
        admit = stack.scheduler.admits[-1]
        events = await stack.turn_events(admit.turn_id, 2)
    assert status == 200 and data == CLASSIFY_REPLY
    assert headers["x-luftpause-run-id"] == "run-7" and headers["x-engine"] == "e"
    assert admit.single_pass and admit.run_id == "" and admit.caller == "alice"
    assert admit.service_class == 1
    url, sent_headers, sent = transport.sent[0]
    assert url.endswith("/classify") and sent == raw
    assert sent_headers["Authorization"] == f"Bearer {ENGINE_KEY}"
    assert events == ["started", "finished"]
    assert all(e.run_id == "" for e in stack.scheduler.events)
    assert stack.dp.runs.runs == {} and stack.dp.runs.turns == {}


async def test_classify_without_a_run_header_gets_a_fresh_run_id() -> None:
    transport = MemoryTransport(lambda *_: json_reply(CLASSIFY_REPLY))
    async with running_stack(lambda: transport) as stack, asyncio.timeout(10):
        status, headers, _ = await decide(stack, {"model": MODEL, "input": "x"})
    assert status == 200 and len(headers["x-luftpause-run-id"]) == 32


async def test_unknown_decide_model_is_the_schedulers_404() -> None:
    transport = MemoryTransport(lambda *_: json_reply(CLASSIFY_REPLY))
    async with running_stack(lambda: transport) as stack, asyncio.timeout(10):
        status, headers, data = await decide(stack, {"model": "nope", "input": "x"})
    assert status == 404 and headers["x-luftpause-run-id"]
    assert "serves model 'nope'" in json.loads(data)["error"]["message"]
    assert transport.sent == []


async def test_classify_refusal_is_passed_through_and_fails_the_turn() -> None:
    transport = MemoryTransport(
        lambda *_: json_reply({"error": "busy"}, status=429, headers={"Retry-After": "2"})
    )
    async with running_stack(lambda: transport) as stack, asyncio.timeout(10):
        status, headers, data = await decide(stack, {"model": MODEL, "input": "x"})
        events = await stack.turn_events(stack.scheduler.admits[-1].turn_id, 2)
    assert status == 429 and headers["Retry-After"] == "2"
    assert json.loads(data) == {"error": "busy"} and events == ["started", "failed"]


async def test_unreachable_engine_is_a_502_naming_the_replica() -> None:
    def refuse(*_: object) -> MemoryResponse:
        raise EngineUnreachable("connection refused")

    async with running_stack(lambda: MemoryTransport(refuse)) as stack, asyncio.timeout(10):
        for body in (
            {"model": MODEL, "input": "x"},
            {"model": MODEL, "input": "x", "labels": ["a", "b"]},
        ):
            status, headers, data = await decide(stack, body)
            events = await stack.turn_events(stack.scheduler.admits[-1].turn_id, 2)
            assert status == 502 and headers["x-luftpause-run-id"]
            assert json.loads(data) == {"error": {"message": "engine engine-a: connection refused"}}
            assert events == ["started", "failed"]


async def test_labels_are_scored_from_one_interactive_one_token_turn() -> None:
    top = {"urgent": 0.6, " lookup": 0.2, "the": 0.1}
    transport = MemoryTransport(lambda *_: json_reply(logprob_reply(top)))
    ask = {"model": MODEL, "input": "the pager rings", "labels": ["urgent", "lookup", "chitchat"]}
    async with running_stack(lambda: transport) as stack, asyncio.timeout(10):
        status, headers, data = await decide(
            stack, ask, **{"x-luftpause-run-id": "run-9", "x-luftpause-class": "batch"}
        )
        admit = stack.scheduler.admits[-1]
        events = await stack.turn_events(admit.turn_id, 2)
    assert status == 200 and headers["x-luftpause-run-id"] == "run-9"
    result = json.loads(data)
    assert result["label"] == "urgent" and result["model"] == MODEL
    assert result["probabilities"]["urgent"] == pytest.approx(0.75)
    assert result["unscored"] == ["chitchat"]
    assert not admit.single_pass and admit.run_id == "run-9" and admit.service_class == 1
    url, _, sent = transport.sent[0]
    doc = json.loads(sent)
    assert url.endswith("/v1/chat/completions")
    assert doc["max_tokens"] == 1 and doc["logprobs"] is True and doc["top_logprobs"] == 20
    assert events == ["started", "finished"]
    assert stack.dp.runs.runs["run-9"].phase.name == "IDLE"


async def test_labels_reply_without_logprobs_is_a_502() -> None:
    reply = {"choices": [{"index": 0, "message": {"content": "urgent"}}]}
    transport = MemoryTransport(lambda *_: json_reply(reply))
    async with running_stack(lambda: transport) as stack, asyncio.timeout(10):
        status, _, data = await decide(stack, {"model": MODEL, "input": "x", "labels": ["a", "b"]})
    assert status == 502 and "logprobs" in json.loads(data)["error"]["message"]


async def test_bad_decide_bodies_are_400s_that_reach_nobody() -> None:
    transport = MemoryTransport(lambda *_: json_reply(CLASSIFY_REPLY))
    async with running_stack(lambda: transport) as stack, asyncio.timeout(10):
        for body in (
            b"{",
            {"model": MODEL},
            {"model": MODEL, "input": "x", "labels": ["a"]},
            {"model": MODEL, "input": "x", "labels": ["a", "A"]},
            {"model": MODEL, "input": "x", "labels": [f"{i}" for i in range(21)]},
        ):
            status, headers, data = await decide(stack, body)
            assert status == 400, body
            assert headers["x-luftpause-run-id"] and json.loads(data)["error"]["message"]
    assert stack.scheduler.admits == [] and transport.sent == []
