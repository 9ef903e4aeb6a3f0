"""Bearer auth: the pure check, and the app with and without a token."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from luftpause.common.auth import bearer_ok, protected, token_from_env
from tests.dataplane.conftest import ENGINE_KEY, Stack, running_stack

TOKEN = b"s3cret-token"


def test_only_the_exact_bearer_token_passes() -> None:
    assert bearer_ok("Bearer s3cret-token", TOKEN)
    assert bearer_ok("bearer  s3cret-token ", TOKEN)
    for header in (None, "", "Bearer", "Bearer ", "Basic s3cret-token", "Bearer s3cret-tokenx"):
        assert not bearer_ok(header, TOKEN)
    assert not bearer_ok("Bearer s3cret-toke", TOKEN)
    assert not bearer_ok("Bearer \udcff\udcfe", TOKEN)  # bytes that were not UTF-8


def test_health_ready_and_metrics_are_open_everything_else_is_protected() -> None:
    assert not protected("/health") and not protected("/ready") and not protected("/metrics")
    for path in ("/v1/chat/completions", "/v1/decide", "/v1/models", "/v1/nothing", "/", "//v1"):
        assert protected(path)


def test_token_comes_from_the_environment_and_blank_means_off() -> None:
    assert token_from_env({"LUFTPAUSE_TOKEN": "abc"}) == b"abc"
    assert token_from_env({"LUFTPAUSE_TOKEN": "  "}) is None
    assert token_from_env({}) is None


@pytest.fixture
async def guarded() -> AsyncIterator[Stack]:
    async with running_stack(token=TOKEN) as s:
        yield s


@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Basic czNjcmV0LXRva2Vu"])
async def test_v1_routes_without_the_token_are_a_json_401(guarded: Stack, auth: str | None) -> None:
    headers = {"Authorization": auth} if auth else {}
    async with asyncio.timeout(10):
        for method, path in (
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/decide"),
            ("GET", "/v1/models"),
            ("DELETE", "/v1/runs/r1"),
            ("GET", "/v1/nothing"),
        ):
            async with guarded.http.request(
                method, guarded.url + path, json=guarded.chat(), headers=headers
            ) as resp:
                assert resp.status == 401, path
                assert resp.headers["WWW-Authenticate"] == "Bearer"
                assert "bearer token" in json.loads(await resp.read())["error"]["message"]
    assert guarded.scheduler.admits == [] and guarded.engine.seen == []


async def test_the_right_token_passes_and_is_not_forwarded(guarded: Stack) -> None:
    async with asyncio.timeout(10):
        status, headers, _ = await guarded.post(guarded.chat(), Authorization="Bearer s3cret-token")
    assert status == 200 and headers["x-luftpause-run-id"]
    assert guarded.engine.seen[0].headers["Authorization"] == f"Bearer {ENGINE_KEY}"


async def test_health_and_metrics_answer_without_the_token(guarded: Stack) -> None:
    async with asyncio.timeout(10):
        for path in ("/health", "/metrics"):
            async with guarded.http.get(guarded.url + path) as resp:
                assert resp.status == 200, path


async def test_without_a_token_everyone_is_accepted(stack: Stack) -> None:
    async with asyncio.timeout(10):
        status, _, _ = await stack.post(stack.chat(), Authorization="Bearer anything")
    assert status == 200
    assert stack.engine.seen[0].headers["Authorization"] == f"Bearer {ENGINE_KEY}"
