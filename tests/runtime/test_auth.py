"""The runtime's bearer check as an ASGI wrapper, driven without sockets."""

from __future__ import annotations

import json
from typing import Any

from luftpause.runtime.server.auth import BearerAuth


async def _call(token: bytes | None, path: str, auth: str | None) -> tuple[int, Any]:
    reached: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"authorization", auth.encode())] if auth is not None else []
    scope = {"type": "http", "path": path, "headers": headers}
    await BearerAuth(app, token)(scope, None, send)
    status = sent[0]["status"]
    body = json.loads(sent[1]["body"])
    assert (status == 200) == bool(reached)
    return status, body


async def test_without_a_token_everyone_is_let_through() -> None:
    assert (await _call(None, "/mcp", None))[0] == 200


async def test_with_a_token_mcp_and_status_need_the_bearer() -> None:
    for path in ("/mcp", "/status", "/anything"):
        status, body = await _call(b"s3cret", path, None)
        assert status == 401 and body["error"]["message"]
        assert (await _call(b"s3cret", path, "Bearer wrong"))[0] == 401
        assert (await _call(b"s3cret", path, "Bearer s3cret"))[0] == 200


async def test_health_ready_and_metrics_stay_open_with_a_token() -> None:
    assert (await _call(b"s3cret", "/health", None))[0] == 200
    assert (await _call(b"s3cret", "/ready", None))[0] == 200
    assert (await _call(b"s3cret", "/metrics", None))[0] == 200
