"""Bad input of every kind is a clear 4xx JSON error, never a 500 or a hang, and the server
keeps serving afterwards."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.forwarding import parse_turn_body, upstream_headers
from luftpause.dataplane.identity import RUN_ID_MAX_BYTES, check_run_id
from tests.dataplane.conftest import Stack
from tests.dataplane.fakes import MODEL

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "doc",
    [
        [],
        "text",
        42,
        None,
        {"messages": MESSAGES},
        {"model": 7, "messages": MESSAGES},
        {"model": ["m"], "messages": MESSAGES},
        {"model": MODEL, "messages": {"role": "user"}},
        {"model": MODEL, "messages": []},
        {"model": MODEL, "messages": ["hi"]},
        {"model": MODEL, "messages": MESSAGES, "stream": "yes"},
        {"model": MODEL, "messages": MESSAGES, "stream": 1},
        {"model": MODEL, "messages": MESSAGES, "max_tokens": "10"},
        {"model": MODEL, "messages": MESSAGES, "max_tokens": 1.5},
        {"model": MODEL, "messages": MESSAGES, "max_tokens": True},
        {"model": MODEL, "messages": MESSAGES, "max_tokens": -1},
        {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": "x"},
    ],
)
def test_wrong_shapes_and_types_are_bad_requests(doc: Any) -> None:
    with pytest.raises(BadRequest):
        parse_turn_body(json.dumps(doc).encode())


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe", b"[" * 100_000, b'{"a": 1e99999}x'])
def test_broken_and_deeply_nested_json_are_bad_requests(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_turn_body(raw)


def test_optional_fields_may_be_null_or_of_the_right_type() -> None:
    doc: dict[str, object] = {
        "model": MODEL,
        "messages": MESSAGES,
        "stream": None,
        "max_tokens": None,
    }
    assert parse_turn_body(json.dumps(doc).encode())[:2] == (MODEL, MESSAGES)
    doc |= {"stream": True, "max_tokens": 5, "max_completion_tokens": 0, "temperature": "odd"}
    assert parse_turn_body(json.dumps(doc).encode())[:2] == (MODEL, MESSAGES)


def test_run_ids_must_be_utf8_and_short() -> None:
    assert check_run_id(None) == "" and check_run_id("  run-1 ") == "run-1"
    assert check_run_id("é" * (RUN_ID_MAX_BYTES // 2)) == "é" * (RUN_ID_MAX_BYTES // 2)
    for bad in ("\udcff", "x" * (RUN_ID_MAX_BYTES + 1), "a\x00b", "a\r\nSet-Cookie: x"):
        with pytest.raises(BadRequest):
            check_run_id(bad)


def test_header_values_that_were_not_utf8_do_not_go_upstream() -> None:
    headers = upstream_headers([("traceparent", "\udcff"), ("x-ok", "é")], api_key="")
    assert "traceparent" not in headers and headers["x-ok"] == "é"


async def post(stack: Stack, path: str, body: Any, **headers: str) -> tuple[int, Any]:
    """Status and, for an error, its JSON body."""
    kwargs: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with stack.http.post(stack.url + path, headers=headers, **kwargs) as resp:
        data = await resp.read()
        return resp.status, json.loads(data) if resp.status >= 400 else data


async def test_bad_bodies_on_every_post_route_are_json_400s(stack: Stack) -> None:
    async with asyncio.timeout(20):
        for path in ("/v1/chat/completions", "/v1/decide"):
            for body in (b"", b"nope", b"[" * 50_000, {"model": 1}, [1, 2], "s"):
                status, doc = await post(stack, path, body)
                assert status == 400, (path, body)
                assert isinstance(doc["error"]["message"], str)
    assert stack.scheduler.admits == []


async def test_long_run_id_and_bad_class_are_400s_with_a_fresh_run_id(stack: Stack) -> None:
    async with asyncio.timeout(10):
        for path, body in (("/v1/chat/completions", stack.chat()), ("/v1/decide", {})):
            for name, value in (("x-luftpause-run-id", "r" * 300), ("x-luftpause-class", "vip")):
                async with stack.http.post(
                    stack.url + path, json=body, headers={name: value}
                ) as resp:
                    doc = json.loads(await resp.read())
                    assert resp.status == 400 and name in doc["error"]["message"]
                    assert len(resp.headers["x-luftpause-run-id"]) == 32
    assert stack.scheduler.admits == []


async def test_overlong_caller_is_cut_not_refused(stack: Stack) -> None:
    async with asyncio.timeout(10):
        status, _ = await post(
            stack,
            "/v1/chat/completions",
            stack.chat(stream=False),
            **{"x-luftpause-caller": "é" * 200},
        )
    assert status == 200 and stack.scheduler.admits[-1].caller == "é" * 64


async def raw_exchange(stack: Stack, head: bytes, body: bytes = b"") -> bytes:
    """Send raw request bytes; the whole response (the server closes after it)."""
    host, port = stack.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
        writer.write(body)
        await writer.drain()
        return await reader.read()
    finally:
        writer.close()


def status_and_json(response: bytes) -> tuple[int, Any]:
    """Status and, for an error, its JSON body."""
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(body) if status >= 400 else None


async def test_header_bytes_that_are_not_utf8_are_refused_or_dropped_never_a_500(
    stack: Stack,
) -> None:
    chat = json.dumps(stack.chat()).encode()
    start = b"POST /v1/chat/completions HTTP/1.1\r\nHost: dp\r\n"
    async with asyncio.timeout(10):
        bad_run = await raw_exchange(stack, start + b"x-luftpause-run-id: r\xff\xfe\r\n", chat)
        bad_class = await raw_exchange(stack, start + b"x-luftpause-class: \xffbatch\r\n", chat)
        caller = await raw_exchange(stack, start + b"x-luftpause-caller: al\xffice\r\n", chat)
        other = await raw_exchange(stack, start + b"traceparent: \xff\xfe\r\n", chat)
    status, doc = status_and_json(bad_run)
    assert status == 400 and "UTF-8" in doc["error"]["message"]
    status, doc = status_and_json(bad_class)
    assert status == 400 and "x-luftpause-class" in doc["error"]["message"]
    assert status_and_json(caller)[0] == 200 and stack.scheduler.admits[0].caller == "alice"
    assert status_and_json(other)[0] == 200
    assert "traceparent" not in {k.lower() for k in stack.engine.seen[-1].headers}


async def test_header_the_http_parser_refuses_is_a_400_and_the_server_keeps_serving(
    stack: Stack,
) -> None:
    start = b"GET /health HTTP/1.1\r\nHost: dp\r\n"
    async with asyncio.timeout(10):
        control = await raw_exchange(stack, start + b"x-luftpause-caller: a\x01b\r\n")
        huge = await raw_exchange(stack, start + b"x-luftpause-run-id: " + b"r" * 9000 + b"\r\n")
        async with stack.http.get(stack.url + "/health") as resp:
            assert resp.status == 200
    # aiohttp's parser answers these before any handler or middleware runs: plain text.
    assert control.startswith(b"HTTP/1.0 400") and huge.startswith(b"HTTP/1.0 400")


async def test_unknown_routes_and_methods_are_json_and_the_server_keeps_serving(
    stack: Stack,
) -> None:
    async with asyncio.timeout(10):
        for method, path, expected in (
            ("GET", "/nothing", 404),
            ("POST", "/v1/embeddings", 404),
            ("GET", "/v1/decide", 405),
            ("PUT", "/v1/chat/completions", 405),
            ("POST", "/health", 405),
        ):
            async with stack.http.request(method, stack.url + path) as resp:
                doc = json.loads(await resp.read())
                assert resp.status == expected and doc["error"]["message"], (method, path)
        status, _ = await post(stack, "/v1/chat/completions", stack.chat())
    assert status == 200


async def test_run_ids_in_the_path_are_checked_like_the_header(stack: Stack) -> None:
    async with asyncio.timeout(10):
        for path in ("/v1/runs/a%00b", "/v1/runs/a%0D%0Ab", "/v1/runs/" + "r" * 300):
            async with stack.http.delete(stack.url + path) as resp:
                doc = json.loads(await resp.read())
                assert resp.status == 400 and "x-luftpause-run-id" in doc["error"]["message"]
        async with stack.http.delete(stack.url + "/v1/runs/%FF%FE") as resp:
            assert resp.status == 200  # undecodable escapes stay as they are
