"""Engine slots end to end: the openai client -> dataplane -> scheduler -> engine.

The endpoint says its engine has 2 slots (`slots: 2`, llama.cpp's --parallel 2). Every turn
placed there names one in llama.cpp's `id_slot` field, replacing any the client sent: a run
gets its own slot back, a new run takes an empty slot before a paused run's, and the slot of a
run that has finished before either. The simulated engine has no slots; its request log shows
what each turn asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from luftpause.testkit.agents import LOOKUP_TOOL
from luftpause.testkit.stack import SIM_MODEL, LocalStack


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalStack]:
    workdir = tmp_path_factory.mktemp("slots")
    async with AsyncExitStack() as exits:
        args = ("--time-scale", "20", "--tool-rounds", "1")
        local = LocalStack(workdir, engine_args=args, engines=1, slots=2)
        await local.start(exits)
        await local.wait_healthy()
        yield local


class Agent:
    """One run's conversation: a tool call, then (after its result) the answer."""

    def __init__(self, client: AsyncOpenAI, run: str) -> None:
        self.client, self.run = client, run
        self.messages: list[Any] = [{"role": "user", "content": f"task of {run} " * 40}]

    async def turn(self, **extra: Any) -> bool:
        """One turn; True when it asked for a tool (whose result is then added)."""
        reply = await self.client.chat.completions.create(
            model=SIM_MODEL,
            messages=self.messages,
            tools=LOOKUP_TOOL,
            max_tokens=16,
            extra_headers={"x-luftpause-run-id": self.run},
            extra_body=extra or None,
        )
        message = reply.choices[0].message
        self.messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
        return bool(message.tool_calls)


async def slots_asked(stack: LocalStack) -> list[int | None]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(stack.engine_url(0) + "/debug/requests") as resp,
    ):
        body = await resp.json()
    return [r["id_slot"] for r in body["requests"] if r.get("path") == "/v1/chat/completions"]


@pytest.mark.asyncio(loop_scope="module")
async def test_each_run_keeps_its_slot_and_new_runs_take_the_cheapest_one(
    stack: LocalStack,
) -> None:
    async with asyncio.timeout(60), AsyncOpenAI(base_url=stack.base_url, api_key="x") as client:
        a, b, c = (Agent(client, run) for run in ("run-a", "run-b", "run-c"))
        assert await a.turn(id_slot=7)  # the client's own id_slot is replaced
        assert await b.turn()  # a is paused on its tool: b takes the empty slot
        assert not await a.turn()  # a's answer, in its own slot; a is done
        assert await c.turn()  # a's slot: a finished, b is paused
        assert not await b.turn()
    first_a, first_b, *rest = await slots_asked(stack)
    assert {first_a, first_b} == {0, 1}
    assert rest == [first_a, first_a, first_b]
    async with aiohttp.ClientSession() as s, s.get(stack.status_url) as resp:
        [replica] = (await resp.json())["replicas"]
    holders = {slot["run"] for slot in replica["slots"]}
    assert replica["capacity"] == 2 and holders == {"run-b", "run-c"}
    assert not any(slot["busy"] for slot in replica["slots"])
