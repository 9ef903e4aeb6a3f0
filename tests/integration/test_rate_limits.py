"""Hosted APIs under rate limits: admission by the provider's budget, on real processes.

Simulated hosted engines (the test kit's limiter: OpenAI- or Anthropic-style headers, fixed
windows of 60 simulated seconds at 20x, so 3 s), `luftpause scheduler` and two `luftpause
dataplane`s, driven with the official openai client. The engines count what they served and
refused (`GET /debug/limits`): luftpause must keep the provider's 429s at zero where its readings
are right, and absorb the 429 a provider sends when it lowers its limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from luftpause.testkit.stack import Dataplane, Endpoint, Launcher, write_endpoints
from luftpause.testkit.status import fetch_status
from luftpause.testkit.waits import read_metrics

pytestmark = pytest.mark.asyncio(loop_scope="module")

OPENAI_MODEL, ANTHROPIC_MODEL, STATED_MODEL, SURPRISE_MODEL = "oai", "claude", "stated", "surprise"
TWIN_MODEL, MIXED_MODEL = "twin", "mixed"
BARE_MODEL, PLAIN_MODEL = "bare", "plain"
HOSTED = ("--time-scale", "20", "--reply-tokens", "40", "--rate-limit-charge", "usage")
# Rate-limited from the start, the limits learned from the first reply's headers.
LEARN: dict[str, Any] = {"limits": {}}
HELLO: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "hello there, how are you today?"}
]


@dataclass
class Stack:
    engines: dict[str, Endpoint]
    dataplanes: tuple[Dataplane, Dataplane]
    status_url: str

    def client(self, which: int = 0) -> AsyncOpenAI:
        base = self.dataplanes[which].base_url
        return AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)

    async def limits(self, engine: str) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as s,
            s.get(self.engines[engine].url + "/debug/limits") as resp,
        ):
            body: dict[str, Any] = await resp.json()
        return body

    async def budget(self, window: str) -> dict[str, Any]:
        status = await fetch_status(self.status_url)
        found: dict[str, Any] = next(b for b in status["budgets"] if b["id"] == window)
        return found


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    workdir = tmp_path_factory.mktemp("ratelimits")
    async with AsyncExitStack() as exits:
        launcher = Launcher(workdir, exits)
        engines = {
            "oai": await launcher.engine(
                "oai",
                *HOSTED,
                "--tpm",
                "400",
                "--rpm",
                "1000",
                models=[OPENAI_MODEL],
                options=LEARN,
            ),
            "claude": await launcher.engine(
                "claude",
                *HOSTED,
                "--rate-limit-headers",
                "anthropic",
                "--itpm",
                "250",
                "--otpm",
                "200",
                models=[ANTHROPIC_MODEL],
                options=LEARN,
            ),
            # Limits stated in the endpoint file, per real minute: a window of 60 real seconds.
            "stated": await launcher.engine(
                "stated",
                "--reply-tokens",
                "40",
                "--tpm",
                "1000",
                models=[STATED_MODEL],
                options={"limits": {"tpm": 1000}},
            ),
            # Two providers of one model, one with twice the other's budget.
            "twin-a": await launcher.engine(
                "twin-a", *HOSTED, "--tpm", "400", models=[TWIN_MODEL], options=LEARN
            ),
            "twin-b": await launcher.engine(
                "twin-b", *HOSTED, "--tpm", "800", models=[TWIN_MODEL], options=LEARN
            ),
            "surprise": await launcher.engine(
                "surprise", *HOSTED, "--tpm", "100000", models=[SURPRISE_MODEL], options=LEARN
            ),
            # Given without `limits`: an output budget that agents' long answers bind, after
            # their short tool calls taught the scheduler that replies are short.
            "mixed": await launcher.engine(
                "mixed",
                *HOSTED[:2],
                *("--reply-tokens", "80", "--rate-limit-charge", "usage"),
                *("--rate-limit-headers", "anthropic", "--itpm", "100000", "--otpm", "240"),
                models=[MIXED_MODEL],
            ),
            # Given without `limits`: a hosted API with a tight budget, and one with none.
            "bare": await launcher.engine(
                "bare", *HOSTED, "--tpm", "400", "--rpm", "30", models=[BARE_MODEL]
            ),
            "plain": await launcher.engine(
                "plain", "--time-scale", "20", "--metrics", "hosted", models=[PLAIN_MODEL]
            ),
        }
        config = write_endpoints(workdir / "endpoints.yaml", list(engines.values()))
        scheduler = await launcher.scheduler(config, "--probe-period", "0.5")
        dataplanes = (
            await launcher.dataplane(scheduler, "--id", "dp-a", name="dp-a", config=config),
            await launcher.dataplane(scheduler, "--id", "dp-b", name="dp-b", config=config),
        )
        yield Stack(engines=engines, dataplanes=dataplanes, status_url=scheduler.status_url)


async def ask(client: AsyncOpenAI, model: str, run: str) -> str:
    reply = await client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=40, extra_headers={"x-luftpause-run-id": run}
    )
    return reply.choices[0].message.content or ""


async def flood(stack: Stack, model: str, turns: int, tag: str = "") -> list[str]:
    """`turns` turns at once, alternately through both dataplanes."""
    async with asyncio.timeout(90), stack.client(0) as a, stack.client(1) as b:
        return await asyncio.gather(
            *(ask((a, b)[i % 2], model, f"{model}{tag}-{i}") for i in range(turns))
        )


async def test_openai_headers_from_two_dataplanes_share_one_window_and_no_turn_is_refused(
    stack: Stack,
) -> None:
    """Five windows' worth of turns at once through two dataplanes: every one is answered and
    the provider never refuses one; the scheduler learned its window from the headers."""
    replies = await flood(stack, OPENAI_MODEL, 20)
    counts = (await stack.limits("oai"))["counts"]
    assert all(replies) and counts["served"] == 20 and counts["refused"] == 0
    budget = await stack.budget("oai")
    tokens = next(d for d in budget["dimensions"] if d["name"] == "tokens")
    assert tokens["limit"] == 400 and budget["provider_429s"] == 0
    assert budget["reading_age_s"] is not None and budget["in_flight"] == 0


async def test_anthropic_headers_with_input_and_output_budgets_and_no_turn_is_refused(
    stack: Stack,
) -> None:
    replies = await flood(stack, ANTHROPIC_MODEL, 14)
    counts = (await stack.limits("claude"))["counts"]
    assert all(replies) and counts["served"] == 14 and counts["refused"] == 0
    budget = await stack.budget("claude")
    limits = {d["name"]: d["limit"] for d in budget["dimensions"]}
    assert limits == {"input_tokens": 250, "output_tokens": 200}


async def test_a_turn_bigger_than_the_whole_window_is_refused_with_429_and_why(
    stack: Stack,
) -> None:
    # ~15 kB: some 3,750 tokens by size
    huge: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word " * 3000}]
    async with asyncio.timeout(30), stack.client() as client:
        with pytest.raises(openai.RateLimitError) as err:
            await client.chat.completions.create(model=STATED_MODEL, messages=huge)
    response = err.value.response
    assert response.status_code == 429 and int(response.headers["Retry-After"]) >= 1
    message = response.json()["error"]["message"]
    assert "whole window is 1000 per minute" in message
    assert (await stack.limits("stated"))["counts"]["served"] == 0  # never sent
    assert (await stack.budget("stated"))["refused"] == 1


async def test_a_provider_that_lowers_its_limit_mid_run_costs_a_429_the_client_never_sees(
    stack: Stack,
) -> None:
    """The scheduler's reading says plenty is left; the provider lowers its limit, refuses
    the next turn, and luftpause holds it until the window resets, then it goes through."""
    assert await flood(stack, SURPRISE_MODEL, 2)
    async with (
        aiohttp.ClientSession() as s,
        s.post(stack.engines["surprise"].url + "/debug/limits", json={"tpm": 150}) as resp,
    ):
        assert resp.status == 200
    replies = await flood(stack, SURPRISE_MODEL, 6, tag="-after")
    counts = (await stack.limits("surprise"))["counts"]
    assert all(replies) and counts["served"] == 8 and counts["refused"] >= 1
    budget = await stack.budget("surprise")
    assert budget["provider_429s"] >= 1 and budget["k"] > 1.0
    retried = 0.0
    for dp in stack.dataplanes:
        metrics = await read_metrics(dp.url + "/metrics")
        retried += sum(
            v
            for key, v in metrics.items()
            if key.startswith("luftpause_dataplane_turns_total{") and 'outcome="retried"' in key
        )
    assert retried == counts["refused"]


async def test_with_two_providers_of_one_model_turns_go_where_there_is_headroom(
    stack: Stack,
) -> None:
    """Four windows' worth of turns for two providers: both serve, in proportion to their
    budgets, and neither refuses one."""
    replies = await flood(stack, TWIN_MODEL, 24)
    a, b = [(await stack.limits(e))["counts"] for e in ("twin-a", "twin-b")]
    assert all(replies) and a["served"] + b["served"] == 24
    assert a["refused"] == b["refused"] == 0
    assert a["served"] >= 4 and b["served"] > a["served"]


async def test_a_hosted_api_given_without_limits_refuses_nothing_in_the_first_burst(
    stack: Stack,
) -> None:
    """16 agents at once to an endpoint the file gives no `limits`: the first turn goes alone,
    its reply's headers give the window, and the provider refuses none of them."""
    replies = await flood(stack, BARE_MODEL, 16)
    counts = (await stack.limits("bare"))["counts"]
    assert all(replies) and counts["served"] == 16 and counts["refused"] == 0
    budget = await stack.budget("bare")
    limits = {d["name"]: d["limit"] for d in budget["dimensions"]}
    assert limits == {"requests": 30, "tokens": 400} and budget["provider_429s"] == 0


LOOKUP: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a thing up.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


async def agent(client: AsyncOpenAI, run: str) -> int:
    """An agent of three tool calls (short replies) and an answer (80 tokens): its turns."""
    messages: list[Any] = [{"role": "user", "content": f"task {run}: find three things"}]
    for turn in range(1, 10):
        reply = await client.chat.completions.create(
            model=MIXED_MODEL,
            messages=messages,
            tools=LOOKUP,
            max_tokens=100,
            extra_headers={"x-luftpause-run-id": run, "x-sim-tool-rounds": "3"},
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return turn
        messages.append(message.model_dump(exclude_none=True))
        messages += [
            {"role": "tool", "tool_call_id": c.id, "content": "found it"}
            for c in message.tool_calls
        ]
    return 0


async def test_long_answers_after_short_tool_calls_bring_no_429_from_an_output_budget(
    stack: Stack,
) -> None:
    """Eight agents, each three short tool calls then a long answer, at a provider given
    without `limits` whose output budget (240 a window) charges the reply as it starts: the
    first replies the scheduler learns from are all short, and a reservation of mean + k sigma
    of them falls short of every answer. None of the 32 turns is refused."""
    async with asyncio.timeout(120), stack.client(0) as a, stack.client(1) as b:
        turns = await asyncio.gather(*(agent((a, b)[i % 2], f"mixed-{i}") for i in range(8)))
    counts = (await stack.limits("mixed"))["counts"]
    assert turns == [4] * 8
    assert counts["served"] == 32 and counts["refused"] == 0


async def test_an_endpoint_given_without_limits_whose_reply_reports_none_has_no_window(
    stack: Stack,
) -> None:
    """Its first reply carries no rate-limit headers: from then on it is not rate-limited (no
    window on the status page, the replica open to the dataplanes)."""
    assert all(await flood(stack, PLAIN_MODEL, 6))
    status = await fetch_status(stack.status_url)
    assert "plain" not in {b["id"] for b in status["budgets"]}
    replica = next(r for r in status["replicas"] if r["id"] == "plain")
    assert replica["open"] is True
