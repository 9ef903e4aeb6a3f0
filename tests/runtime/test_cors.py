"""CORS on the runtime's GET /status, so the scheduler's page on another port can read the run
tree: the wrapper around the runtime's real app, driven through ASGI without sockets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import httpx
import pytest

from luftpause.runtime.journal.file import JournalFile
from luftpause.runtime.loop.llm import Llm
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.loop.upstream import Upstreams
from luftpause.runtime.main import parse_args
from luftpause.runtime.server.app import build_server
from luftpause.runtime.server.auth import BearerAuth
from luftpause.runtime.server.cors import DEFAULT_ORIGINS, StatusCors

PAGE = "http://scheduler.example:5001"


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    # No run is spawned here: the model and the tools are never reached.
    rt = Runtime(JournalFile(tmp_path), cast(Llm, None), cast(Upstreams, None))
    rt.resume()
    try:
        yield rt
    finally:
        await rt.stop()


def client(runtime: Runtime, origins: tuple[str, ...], token: bytes | None) -> httpx.AsyncClient:
    server = build_server(runtime, default_model="sim")
    app = StatusCors(
        BearerAuth(server.streamable_http_app(streamable_http_path="/mcp"), token), origins
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://runtime")


async def test_status_answers_an_allowed_origin_with_its_origin(runtime: Runtime) -> None:
    async with client(runtime, (PAGE,), None) as http:
        resp = await http.get("/status", headers={"Origin": PAGE})
    body = resp.json()
    assert resp.status_code == 200 and (body["runs"], body["byState"], body["tree"]) == (0, {}, [])
    assert resp.headers["access-control-allow-origin"] == PAGE
    assert resp.headers["vary"] == "Origin"


async def test_status_gives_another_origin_no_cors_header(runtime: Runtime) -> None:
    async with client(runtime, (PAGE,), None) as http:
        resp = await http.get("/status", headers={"Origin": "http://elsewhere.example"})
        plain = await http.get("/status")
    assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers
    assert "access-control-allow-origin" not in plain.headers


async def test_a_star_lets_every_origin_read_the_status(runtime: Runtime) -> None:
    async with client(runtime, ("*",), None) as http:
        resp = await http.get("/status", headers={"Origin": "http://elsewhere.example"})
    assert resp.headers["access-control-allow-origin"] == "*"


async def test_the_preflight_is_answered_before_the_bearer_check(runtime: Runtime) -> None:
    headers = {
        "Origin": PAGE,
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization",
    }
    async with client(runtime, (PAGE,), b"s3cret") as http:
        resp = await http.options("/status", headers=headers)
    assert resp.status_code == 204
    assert resp.headers["access-control-allow-origin"] == PAGE
    assert resp.headers["access-control-allow-methods"] == "GET, OPTIONS"
    assert resp.headers["access-control-allow-headers"] == "authorization"


async def test_a_refused_status_still_tells_the_page_why(runtime: Runtime) -> None:
    async with client(runtime, (PAGE,), b"s3cret") as http:
        refused = await http.get("/status", headers={"Origin": PAGE})
        allowed = await http.get(
            "/status", headers={"Origin": PAGE, "Authorization": "Bearer s3cret"}
        )
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == PAGE
    assert allowed.status_code == 200


async def test_other_paths_get_no_cors(runtime: Runtime) -> None:
    async with client(runtime, ("*",), None) as http:
        resp = await http.get("/health", headers={"Origin": PAGE})
    assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers


def test_the_default_allows_the_scheduler_page_at_its_default_address() -> None:
    cors = StatusCors(None, DEFAULT_ORIGINS)
    assert cors.allowed("http://127.0.0.1:5001") == b"http://127.0.0.1:5001"
    assert cors.allowed("http://localhost:5001") == b"http://localhost:5001"
    assert cors.allowed("http://evil.example") is None
    assert cors.allowed(None) is None


def test_the_origins_come_from_the_command_line_or_the_environment() -> None:
    assert parse_args([], {}).cors_origins == DEFAULT_ORIGINS
    assert parse_args(["--cors-origin", "*"], {}).cors_origins == ("*",)
    env = {"LUFTPAUSE_CORS_ORIGIN": f"{PAGE},http://other.example"}
    assert parse_args([], env).cors_origins == (PAGE, "http://other.example")
