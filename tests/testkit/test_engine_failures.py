"""Failure injection in the engine simulator: `x-sim-fail` refuses at once or cuts a reply.

The parser is tested without sockets; the server over loopback with aiohttp and the official
OpenAI client. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest

from luftpause.testkit.engine.params import SimParams
from luftpause.testkit.engine.parsing import (
    MIDSTREAM_DEFAULT_CHUNKS,
    Failure,
    HttpError,
    parse_chat,
    parse_failure,
)
from tests.testkit.test_engine_server import FAST, engine, metrics, openai_client, until

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("503", Failure(status=503)),
        (" 429 ", Failure(status=429)),
        ("midstream", Failure(after_chunks=MIDSTREAM_DEFAULT_CHUNKS)),
        ("MIDSTREAM:0", Failure(after_chunks=0)),
        ("midstream:7", Failure(after_chunks=7)),
    ],
)
def test_fail_header_values_parse_to_a_refusal_or_a_cut(
    value: str | None, expected: Failure | None
) -> None:
    assert parse_failure(value) == expected


@pytest.mark.parametrize("value", ["200", "600", "boom", "midstream:", "midstream:x", "cut:3"])
def test_a_malformed_fail_header_is_a_400(value: str) -> None:
    with pytest.raises(HttpError) as err:
        parse_failure(value)
    assert err.value.status == 400


async def test_an_injected_status_is_answered_at_once_with_an_error_body_and_retry_after() -> None:
    headers = {"x-sim-fail": "503"}
    async with engine(engine=FAST) as server, aiohttp.ClientSession() as http:
        async with (
            asyncio.timeout(10),
            http.post(server.url + "/v1/chat/completions", json=BODY, headers=headers) as resp,
        ):
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "1"
            payload = await resp.json()
        assert payload["error"]["type"] == "server_error"
        assert "503" in payload["error"]["message"]
        m = await metrics(http, server)
        assert m["luftpause_sim_requests_total"] == 1
        assert m["vllm:prompt_tokens_total"] == 0  # no engine work was done


async def test_a_stream_cut_midstream_ends_without_finish_or_done_and_is_aborted() -> None:
    slow = engine(reply_tokens=500, default_max_tokens=500, time_scale=20.0)
    async with slow as server, aiohttp.ClientSession() as http:
        body = {**BODY, "stream": True}
        raw = b""
        async with asyncio.timeout(20):
            async with http.post(
                server.url + "/v1/chat/completions",
                json=body,
                headers={"x-sim-fail": "midstream:4"},
            ) as resp:
                assert resp.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for chunk in resp.content.iter_any():
                        raw += chunk
        events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
        assert len(events) == 4
        assert b"[DONE]" not in raw and b'"finish_reason":"stop"' not in raw

        async def aborted() -> bool:
            m = await metrics(http, server)
            return m["luftpause_sim_aborted_total"] == 1 and m["sglang:num_running_reqs"] == 0

        await until(aborted)
        assert (await metrics(http, server))["vllm:generation_tokens_total"] < 500


async def test_the_openai_client_raises_on_a_stream_cut_midstream() -> None:
    async with engine(engine=FAST) as server, openai_client(server) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=BODY["messages"],
            stream=True,
            extra_headers={"x-sim-fail": "midstream:2"},
        )
        got = 0
        with pytest.raises(openai.APIConnectionError):
            async with asyncio.timeout(10):
                async for chunk in stream:
                    assert chunk.choices[0].finish_reason is None
                    got += 1
        assert got == 2


async def test_a_plain_reply_cut_midstream_breaks_off_inside_its_body() -> None:
    headers = {"x-sim-fail": "midstream"}
    async with (
        engine(engine=FAST) as server,
        aiohttp.ClientSession() as http,
        asyncio.timeout(10),
        http.post(server.url + "/v1/chat/completions", json=BODY, headers=headers) as resp,
    ):
        assert resp.status == 200
        assert resp.content_length is not None
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()


def test_malformed_tools_are_a_400_not_a_crash() -> None:
    tools: object
    for tools in ([None], {}, [{}], "x", [{"function": "f"}]):
        body: dict[str, object] = {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": tools,
        }
        with pytest.raises(HttpError) as err:
            parse_chat(body, {}, SimParams())
        assert err.value.status == 400
