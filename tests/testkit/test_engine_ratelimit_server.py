"""The simulator's hosted-API mode over HTTP on loopback: both refill regimes, both header
families read back by luftpause's own parser, what is charged and billed, and the limits changed
while running (`/debug/limits`). Every wait is bounded."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from luftpause.common import ratelimits
from luftpause.testkit.engine.server import RunningServer
from tests.testkit.test_engine_server import FAST, engine, metrics, until

BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 100,
}


async def chat(
    http: aiohttp.ClientSession, server: RunningServer, **extra: Any
) -> tuple[int, Any, dict[str, Any]]:
    async with asyncio.timeout(20):
        async with http.post(server.url + "/v1/chat/completions", json={**BODY, **extra}) as r:
            return r.status, r.headers, await r.json()


async def limits(
    http: aiohttp.ClientSession, server: RunningServer, body: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    url = server.url + "/debug/limits"
    async with asyncio.timeout(20):
        if body is None:
            async with http.get(url) as resp:
                return resp.status, await resp.json()
        async with http.post(url, data=body) as resp:
            return resp.status, await resp.json()


@pytest.mark.parametrize(("charge", "reply"), [("max_tokens", 100), ("usage", 64)])
async def test_the_token_budget_is_charged_max_tokens_or_the_reply_to_come(
    charge: str, reply: int
) -> None:
    hosted = engine(engine=FAST, tpm=10_000, rate_limit_charge=charge, time_scale=1.0)
    async with hosted as server, aiohttp.ClientSession() as http:
        status, headers, out = await chat(http, server)
    assert status == 200 and out["usage"]["completion_tokens"] == 64
    prompt = out["usage"]["prompt_tokens"]
    assert int(headers["x-ratelimit-remaining-tokens"]) == 10_000 - prompt - reply


async def test_anthropic_headers_over_http_name_the_configured_budgets_only() -> None:
    hosted = engine(
        engine=FAST,
        rpm=50,
        itpm=10_000,
        otpm=1_000,
        rate_limit_regime="continuous",
        rate_limit_headers="anthropic",
        time_scale=1.0,
    )
    async with hosted as server, aiohttp.ClientSession() as http:
        status, headers, out = await chat(http, server)
    assert status == 200
    assert not any(name.lower().startswith("x-ratelimit") for name in headers)
    reading = ratelimits.read(headers, time.time())
    assert reading is not None and reading.malformed == ()
    assert set(reading.budgets) == {"requests", "input_tokens", "output_tokens"}
    used_input = reading.budgets["input_tokens"]
    assert used_input.limit == 10_000 and used_input.remaining is not None
    assert 10_000 - out["usage"]["prompt_tokens"] <= used_input.remaining < 10_000
    for budget in reading.budgets.values():
        assert budget.reset_s is not None and 0 <= budget.reset_s <= 60.0


async def test_waiting_the_retry_after_of_a_continuous_bucket_is_enough() -> None:
    # 200 tokens per simulated minute at 60x: 200 tokens per real second.
    hosted = engine(engine=FAST, tpm=200, rate_limit_regime="continuous", time_scale=60.0)
    async with hosted as server, aiohttp.ClientSession() as http:
        assert (await chat(http, server))[0] == 200
        status, headers, out = await chat(http, server)
        assert status == 429 and out["error"]["type"] == "rate_limit_exceeded"
        reading = ratelimits.read(headers, time.time())
        assert reading is not None and reading.malformed == ()
        assert int(headers["Retry-After"]) == 1
        wait_s = int(headers["retry-after-ms"]) / 1000
        assert 0 < wait_s <= 1.0
        await asyncio.sleep(wait_s)  # the behaviour under test: the wait the 429 asked for
        assert (await chat(http, server))[0] == 200


async def test_served_refused_and_billed_are_counted_and_reset() -> None:
    async with (
        engine(engine=FAST, rpm=1, time_scale=1.0) as server,
        aiohttp.ClientSession() as http,
    ):
        _, _, out = await chat(http, server)
        status, _, _ = await chat(http, server)
        assert status == 429
        billed = out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
        refused_cost = out["usage"]["prompt_tokens"] + 100  # prompt + max_tokens
        m = await metrics(http, server)
        assert m["luftpause_sim_ratelimit_served_total"] == 1
        assert m["luftpause_sim_ratelimit_refused_total"] == 1
        assert m["luftpause_sim_rate_limited_total"] == 1
        assert m["luftpause_sim_billed_tokens_total"] == billed
        assert m["luftpause_sim_refused_tokens_total"] == refused_cost
        _, described = await limits(http, server)
        assert described["counts"] == {
            "served": 1,
            "refused": 1,
            "billed_tokens": billed,
            "refused_tokens": refused_cost,
        }
        async with http.post(server.url + "/debug/reset") as resp:
            assert resp.status == 200
        _, described = await limits(http, server)
        assert set(described["counts"].values()) == {0}
        assert described["budgets"]["requests"]["remaining"] == 1


async def test_a_reply_cut_short_bills_what_was_generated() -> None:
    slow = engine(reply_tokens=500, default_max_tokens=500, tpm=100_000, time_scale=20.0)
    async with slow as server, aiohttp.ClientSession() as http:
        async with asyncio.timeout(20):
            async with http.post(
                server.url + "/v1/chat/completions",
                json={"model": "m", "messages": BODY["messages"], "stream": True},
                headers={"x-sim-fail": "midstream:4"},
            ) as resp:
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for _ in resp.content.iter_any():
                        pass

        async def billed() -> bool:
            return (await metrics(http, server))["luftpause_sim_billed_tokens_total"] > 0

        await until(billed)
        m = await metrics(http, server)
        prompt = m["vllm:prompt_tokens_total"]
        assert prompt + 4 <= m["luftpause_sim_billed_tokens_total"] < prompt + 500


async def test_debug_limits_shows_the_limits_regime_and_what_remains() -> None:
    hosted = engine(engine=FAST, rpm=3, otpm=500, rate_limit_regime="continuous")
    async with hosted as server, aiohttp.ClientSession() as http:
        status, described = await limits(http, server)
    assert status == 200
    assert described["limits"] == {"rpm": 3, "tpm": None, "itpm": None, "otpm": 500}
    assert (described["regime"], described["window_s"]) == ("continuous", 60.0)
    assert (described["charge"], described["headers"]) == ("max_tokens", "openai")
    assert described["budgets"] == {
        "requests": {"limit": 3, "remaining": 3, "reset_s": 0.0},
        "output_tokens": {"limit": 500, "remaining": 500, "reset_s": 0.0},
    }


async def test_the_provider_lowers_its_limit_mid_run_and_the_next_request_gets_a_429() -> None:
    async with (
        engine(engine=FAST, rpm=10, tpm=100_000, time_scale=1.0) as server,
        aiohttp.ClientSession() as http,
    ):
        for _ in range(2):
            assert (await chat(http, server))[0] == 200
        status, described = await limits(http, server, json.dumps({"rpm": 2}).encode())
        assert status == 200 and described["limits"]["rpm"] == 2
        assert described["budgets"]["requests"]["remaining"] == 0
        status, headers, _ = await chat(http, server)
        assert status == 429 and int(headers["Retry-After"]) >= 1
        await limits(http, server, json.dumps({"rpm": None, "tpm": 500}).encode())
        status, headers, _ = await chat(http, server)
        assert status == 200 and headers["x-ratelimit-limit-tokens"] == "500"
        assert "x-ratelimit-limit-requests" not in headers


async def test_limits_can_be_set_on_an_engine_started_without_any() -> None:
    async with engine(engine=FAST) as server, aiohttp.ClientSession() as http:
        _, headers, _ = await chat(http, server)
        assert not any(name.lower().startswith("x-ratelimit") for name in headers)
        await limits(http, server, b'{"rpm": 1}')
        assert (await chat(http, server))[0] == 200
        assert (await chat(http, server))[0] == 429


@pytest.mark.parametrize(
    "body", [b"not json", b"[1]", b'{"rpm": 0}', b'{"rpm": true}', b'{"rpd": 5}', b'{"tpm": "9"}']
)
async def test_bad_limits_are_answered_400_with_a_message(body: bytes) -> None:
    async with engine(engine=FAST, rpm=5) as server, aiohttp.ClientSession() as http:
        status, out = await limits(http, server, body)
        assert status == 400 and out["error"]["message"]
        assert (await limits(http, server))[1]["limits"]["rpm"] == 5


async def test_classify_is_charged_its_prompt_tokens_through_the_same_limiter() -> None:
    single = engine(engine=FAST, kind="single-pass", rpm=1, tpm=10_000, time_scale=1.0)
    async with single as server, aiohttp.ClientSession() as http:
        body = {"model": "clf", "input": ["the server is down", "hello"]}
        async with http.post(server.url + "/classify", json=body) as resp:
            assert resp.status == 200
            prompt = (await resp.json())["usage"]["prompt_tokens"]
            assert int(resp.headers["x-ratelimit-remaining-tokens"]) == 10_000 - prompt
        async with http.post(server.url + "/classify", json=body) as resp:
            assert resp.status == 429
        _, described = await limits(http, server)
        assert described["counts"]["billed_tokens"] == prompt
        assert described["counts"]["refused_tokens"] == prompt
