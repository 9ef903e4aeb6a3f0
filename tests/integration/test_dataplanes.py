"""Several dataplanes on one scheduler; one of them dies; runs end by DELETE.

Real processes on loopback: two simulated engines, one scheduler, two dataplanes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from luftpause.testkit.stack import SIM_MODEL, Dataplane, LocalStack
from luftpause.testkit.status import fetch_status
from luftpause.testkit.waits import WAIT_SECONDS, read_metrics

pytestmark = pytest.mark.asyncio(loop_scope="module")
GRACE_S = 2.0


@dataclass
class Pool:
    stack: LocalStack
    dataplanes: dict[str, Dataplane]

    def client(self, dp: str, **headers: str) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=self.dataplanes[dp].base_url,
            api_key="x",
            max_retries=0,
            timeout=60,
            default_headers=headers,
        )

    async def status(self) -> dict[str, Any]:
        return await fetch_status(self.stack.status_url)

    async def until(
        self, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = WAIT_SECONDS
    ) -> dict[str, Any]:
        return await self.stack.until(check, what, timeout)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pool]:
    async with AsyncExitStack() as exits:
        stack = LocalStack(
            tmp_path_factory.mktemp("dataplanes"),
            engine_args=("--tool-rounds", "2", "--time-scale", "5"),
            with_dataplane=False,
            scheduler_args=("--dataplane-grace", str(GRACE_S)),
        )
        await stack.start(exits)
        dataplanes = {
            dp: await stack.launcher.dataplane(stack.scheduler, "--id", dp, name=dp)
            for dp in ("dp-a", "dp-b")
        }
        p = Pool(stack, dataplanes)
        await p.until(
            lambda s: (
                all(r["healthy"] for r in s["replicas"])
                and {d["id"] for d in s["dataplanes"] if d["streams"]} == set(dataplanes)
            ),
            "every replica healthy and both dataplanes in session",
        )
        yield p


async def _agent(c: AsyncOpenAI, task: str) -> set[str]:
    messages: list[Any] = [{"role": "user", "content": task}]
    tools: list[Any] = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {
                    "type": "object",
                    "properties": {"q": {"type": "string"}},
                    "required": ["q"],
                },
            },
        }
    ]
    seen = set()
    for _ in range(5):
        reply = await c.chat.completions.create(
            model=SIM_MODEL, messages=messages, tools=tools, max_tokens=16
        )
        seen.add(reply.system_fingerprint or "")
        msg = reply.choices[0].message
        if not msg.tool_calls:
            return seen
        messages.append(msg.model_dump(exclude_none=True))
        messages += [
            {"role": "tool", "tool_call_id": call.id, "content": "ok"} for call in msg.tool_calls
        ]
    raise AssertionError("no final answer")


async def test_two_dataplanes_serve_runs_side_by_side(pool: Pool) -> None:
    async def one(i: int) -> set[str]:
        dp = "dp-a" if i % 2 else "dp-b"
        async with pool.client(dp, **{"x-luftpause-run-id": f"side-{i}"}) as c:
            return await _agent(c, f"task {i}")

    async with asyncio.timeout(60):
        seen = await asyncio.gather(*(one(i) for i in range(12)))
    assert all(len(s) == 1 for s in seen)  # every run kept its replica
    st = await pool.until(lambda s: s["turns_in_flight"] == 0, "every turn over")
    assert st["held_total"] == 0


async def _placed_locally(pool: Pool, dp: str) -> float:
    metrics = await read_metrics(pool.dataplanes[dp].url + "/metrics")
    return metrics["luftpause_dataplane_placed_locally_total"]


async def test_a_run_whose_turns_hop_between_dataplanes_is_asked_for_by_the_one_it_left(
    pool: Pool,
) -> None:
    """Turns 1 and 3 of the run come through dp-a, turn 2 through dp-b. When dp-b's turn is
    placed, dp-a is told to forget the run, so turn 3 is asked for, not placed by dp-a on the
    replica it last saw; every turn lands on the run's replica."""
    tools: list[Any] = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    before = await _placed_locally(pool, "dp-a")
    messages: list[Any] = [{"role": "user", "content": "hop"}]
    seen = []
    async with asyncio.timeout(60):
        for dp in ("dp-a", "dp-b", "dp-a"):
            async with pool.client(dp, **{"x-luftpause-run-id": "hopper"}) as c:
                reply = await c.chat.completions.create(
                    model=SIM_MODEL, messages=messages, tools=tools, max_tokens=16
                )
            seen.append(reply.system_fingerprint)
            msg = reply.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            messages += [
                {"role": "tool", "tool_call_id": call.id, "content": "ok"}
                for call in msg.tool_calls or []
            ]
            await pool.until(lambda s: s["turns_in_flight"] == 0, f"the turn through {dp} over")
    assert len(set(seen)) == 1
    assert await _placed_locally(pool, "dp-a") == before


async def test_deleted_run_is_forgotten_by_the_scheduler(pool: Pool) -> None:
    async with asyncio.timeout(30), pool.client("dp-a", **{"x-luftpause-run-id": "gone"}) as c:
        await c.chat.completions.create(
            model=SIM_MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
        before = (await pool.status())["runs_total"]
        async with (
            aiohttp.ClientSession() as s,
            s.delete(pool.dataplanes["dp-a"].base_url + "/runs/gone") as resp,
        ):
            assert resp.status == 200
    await pool.until(lambda s: s["runs_total"] == before - 1, "the scheduler to forget run 'gone'")


async def test_turns_of_a_dataplane_that_died_are_released_after_the_grace_period(
    pool: Pool,
) -> None:
    async with pool.client("dp-b") as c, asyncio.timeout(2 * WAIT_SECONDS):
        stream = await c.chat.completions.create(
            model=SIM_MODEL,
            stream=True,
            max_tokens=2000,
            messages=[{"role": "user", "content": "a long answer please"}],
        )
        async for _ in stream:
            break  # the turn is being generated through dp-b
        await pool.until(lambda s: s["turns_in_flight"] == 1, "the long turn in flight")
        await pool.stack.procs["dp-b"].kill()
        gone = await pool.until(
            lambda s: any(d["id"] == "dp-b" and d["gone_s"] is not None for d in s["dataplanes"]),
            "the scheduler to see dp-b gone",
        )
        assert gone["turns_in_flight"] == 1  # held for the grace period, not dropped at once
        await pool.until(
            lambda s: s["turns_in_flight"] == 0, "dp-b's turn released after the grace period"
        )
    async with asyncio.timeout(30), pool.client("dp-a") as a:
        reply = await a.chat.completions.create(
            model=SIM_MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.choices[0].message.content is not None
