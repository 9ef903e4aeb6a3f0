"""What crosses the proxy: body checks, the engine priority, and the headers each way."""

from __future__ import annotations

import json

import pytest

from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.forwarding import (
    downstream_headers,
    parse_turn_body,
    upstream_headers,
    with_fields,
)


def test_body_gives_model_and_messages() -> None:
    model, messages, _, limit = parse_turn_body(b'{"model": "m", "messages": [{"role": "user"}]}')
    assert model == "m" and messages == [{"role": "user"}] and limit == 0


@pytest.mark.parametrize(
    ("fields", "limit"),
    [
        ('"max_tokens": 100', 100),
        ('"max_completion_tokens": 50', 50),
        ('"max_completion_tokens": 50, "max_tokens": 100', 50),
        ('"max_tokens": null', 0),
    ],
)
def test_body_gives_the_reply_limit(fields: str, limit: int) -> None:
    body = '{"model": "m", "messages": [{"role": "user"}], ' + fields + "}"
    assert parse_turn_body(body.encode()).max_tokens == limit


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"\xff\xfe",
        b"[]",
        b'{"messages": [{"role": "user"}]}',
        b'{"model": "", "messages": [{"role": "user"}]}',
        b'{"model": 3, "messages": [{"role": "user"}]}',
        b'{"model": "m"}',
        b'{"model": "m", "messages": []}',
        b'{"model": "m", "messages": {"role": "user"}}',
    ],
)
def test_malformed_bodies_are_bad_requests(body: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_turn_body(body)


def test_client_credentials_and_our_headers_do_not_go_upstream() -> None:
    client = [
        ("Host", "dp:8080"),
        ("Authorization", "Bearer client-secret"),
        ("Content-Length", "12"),
        ("Content-Type", "application/json"),
        ("Connection", "keep-alive"),
        ("Accept-Encoding", "gzip"),
        ("X-Luftpause-Run-Id", "r"),
        ("x-luftpause-caller", "c"),
        ("Traceparent", "00-abc-def-01"),
        ("User-Agent", "agent/1"),
    ]
    assert upstream_headers(client, api_key="") == {
        "Content-Type": "application/json",
        "Traceparent": "00-abc-def-01",
        "User-Agent": "agent/1",
        "Accept-Encoding": "identity",
    }


def test_engine_key_goes_upstream_as_bearer_and_json_is_the_default_type() -> None:
    headers = upstream_headers([("Authorization", "Bearer client")], api_key="k")
    assert headers["Authorization"] == "Bearer k"
    assert headers["Content-Type"] == "application/json"


def test_engine_headers_come_back_with_the_run_id() -> None:
    engine = [
        ("Content-Type", "application/json"),
        ("Retry-After", "3"),
        ("x-ratelimit-remaining-tokens", "10"),
        ("Content-Length", "5"),
        ("Transfer-Encoding", "chunked"),
        ("Server", "uvicorn"),
        ("Date", "today"),
    ]
    assert downstream_headers(engine, "run-1") == [
        ("Content-Type", "application/json"),
        ("Retry-After", "3"),
        ("x-ratelimit-remaining-tokens", "10"),
        ("x-luftpause-run-id", "run-1"),
    ]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"m","messages":[]}', {"priority": 3, "model": "m", "messages": []}),
        (b'  {\n "model": "m"}', {"priority": 3, "model": "m"}),
        (b"{}", {"priority": 3}),
        (b"{ }", {"priority": 3}),
        (b'{"model":"m","priority":-5}', {"model": "m", "priority": 3}),
        (b'{"model":"m","messages":[{"content":"\\"priority\\""}]}', None),
    ],
)
def test_priority_goes_into_the_body_and_replaces_the_clients(
    body: bytes, expected: dict[str, object] | None
) -> None:
    out = json.loads(with_fields(body, {"priority": 3}))
    if expected is None:
        expected = {**json.loads(body), "priority": 3}
    assert out == expected
    assert out["priority"] == 3


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","messages":[]}',
        b"{}",
        b'{"model":"m","id_slot":7}',
        b'{"priority":1,"model":"m"}',
        b'{"model":"m","messages":[{"content":"\\"id_slot\\""}]}',
    ],
)
def test_priority_and_slot_go_in_together_and_replace_the_clients(body: bytes) -> None:
    out = json.loads(with_fields(body, {"priority": 3, "id_slot": 2}))
    assert out == {**json.loads(body), "priority": 3, "id_slot": 2}


def test_no_fields_leave_the_body_as_it_is() -> None:
    body = b' {"model": "m", "priority": 9}'
    assert with_fields(body, {}) is body
