"""Engine-side priority end to end: the openai client -> dataplane -> scheduler -> engine.

The endpoint file gives the engine's `priority` per class; every turn placed there carries its
class's number in the body, replacing any the client sent, and the simulated engine (set to
order its queue by priority, lower first, as vLLM does) serves a queued interactive turn before
the batch turns queued ahead of it.

A second stack's engine also preempts, as SGLang with priority scheduling does: a waiting
request takes the place of a running one whose priority is worse by more than 10. Its endpoint
says so (`preemptive: true`) and gives batch 100, interactive 0. An interactive turn sent while
a batch turn streams finishes first; the batch turn's stream stalls meanwhile and then goes on
to its end, every token in order, on the same connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from luftpause.testkit.stack import SIM_MODEL, LocalStack

# One engine that runs one request at a time, slowly enough that later ones queue in it.
ENGINE_ARGS = (
    "--max-running",
    "1",
    "--tool-rounds",
    "0",
    "--priority-scheduling",
    "low-first",
)


async def _running_stack(
    workdir: Path, engine_args: tuple[str, ...], **kw: Any
) -> AsyncIterator[LocalStack]:
    async with AsyncExitStack() as exits:
        local = LocalStack(workdir, engine_args=(*ENGINE_ARGS, *engine_args), engines=1, **kw)
        await local.start(exits)
        await local.wait_healthy()
        yield local


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalStack]:
    workdir = tmp_path_factory.mktemp("priority")
    args = ("--time-scale", "4", "--reply-tokens", "40")
    async for local in _running_stack(workdir, args, priority=(0, 10)):
        yield local


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def preemptive(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalStack]:
    workdir = tmp_path_factory.mktemp("preemption")
    args = ("--time-scale", "5", "--reply-tokens", "60", "--priority-preemption-threshold", "10")
    async for local in _running_stack(workdir, args, priority=(0, 100), preemptive=True):
        yield local


def client(stack: LocalStack, cls: str) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=stack.base_url,
        api_key="x",
        max_retries=0,
        timeout=60,
        default_headers={"x-luftpause-class": cls},
    )


async def engine_requests(stack: LocalStack) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(stack.engine_url(0) + "/debug/requests") as resp,
    ):
        body: dict[str, list[dict[str, Any]]] = await resp.json()
    return [r for r in body["requests"] if r.get("path") == "/v1/chat/completions"]


async def reset(stack: LocalStack) -> None:
    async with aiohttp.ClientSession() as s, s.post(stack.engine_url(0) + "/debug/reset"):
        pass


@pytest.mark.asyncio(loop_scope="module")
async def test_each_class_carries_its_number_and_the_clients_own_is_replaced(
    stack: LocalStack,
) -> None:
    await reset(stack)
    messages: Any = [{"role": "user", "content": "hello"}]
    async with (
        asyncio.timeout(60),
        client(stack, "interactive") as interactive,
        client(stack, "batch") as batch,
    ):
        await interactive.chat.completions.create(
            model=SIM_MODEL, messages=messages, max_tokens=4, extra_body={"priority": 99}
        )
        await batch.chat.completions.create(
            model=SIM_MODEL, messages=messages, max_tokens=4, extra_body={"priority": -99}
        )
    assert [r["priority"] for r in await engine_requests(stack)] == [0, 10]


@pytest.mark.asyncio(loop_scope="module")
async def test_engine_serves_a_queued_interactive_turn_before_earlier_batch_turns(
    stack: LocalStack,
) -> None:
    await reset(stack)
    messages: Any = [{"role": "user", "content": "work"}]
    done: list[str] = []

    async def turn(cls: str, name: str) -> None:
        async with client(stack, cls) as c:
            await c.chat.completions.create(model=SIM_MODEL, messages=messages, max_tokens=40)
        done.append(name)

    async with asyncio.timeout(60):
        # The engine reports no queue until it has one, so the scheduler lets all of them
        # through; the engine's own queue decides the order.
        first = asyncio.create_task(turn("batch", "batch-0"))
        while not await engine_requests(stack):
            await asyncio.sleep(0.01)
        batch = [asyncio.create_task(turn("batch", f"batch-{i}")) for i in (1, 2, 3)]
        while len(await engine_requests(stack)) < 4:
            await asyncio.sleep(0.01)
        interactive = asyncio.create_task(turn("interactive", "interactive"))
        while len(await engine_requests(stack)) < 5:
            await asyncio.sleep(0.01)
        # When the interactive turn reached the engine, one batch turn at most was running and
        # the rest waited: it goes ahead of every one that waited (on a slow machine, more of
        # the batch turns may have finished before it even arrived).
        finished_on_arrival = len(done)
        await asyncio.gather(first, interactive, *batch)
    assert finished_on_arrival <= 2, f"too slow to queue anything behind: {done}"
    assert done.index("interactive") <= finished_on_arrival + 1, done


async def preemptions(stack: LocalStack) -> float:
    async with (
        aiohttp.ClientSession() as s,
        s.get(stack.engine_url(0) + "/metrics") as resp,
    ):
        text = await resp.text()
    [line] = [x for x in text.splitlines() if x.startswith("vllm:num_preemptions_total")]
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.asyncio(loop_scope="module")
async def test_an_interactive_turn_preempts_a_streaming_batch_turn_which_then_completes(
    preemptive: LocalStack,
) -> None:
    stack = preemptive
    messages: Any = [{"role": "user", "content": "work"}]
    done: list[str] = []
    async with (
        asyncio.timeout(60),
        client(stack, "batch") as batch,
        client(stack, "interactive") as inter,
    ):
        first_chunk = asyncio.Event()

        async def batch_turn() -> tuple[str, str | None]:
            text, finish = "", None
            stream = await batch.chat.completions.create(
                model=SIM_MODEL, messages=messages, max_tokens=60, stream=True
            )
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
                    first_chunk.set()
            done.append("batch")
            return text, finish

        running = asyncio.create_task(batch_turn())
        await first_chunk.wait()
        reply = await inter.chat.completions.create(
            model=SIM_MODEL, messages=messages, max_tokens=60
        )
        done.append("interactive")
        text, finish = await running
    assert done == ["interactive", "batch"]
    assert reply.choices[0].finish_reason == "stop"
    assert finish == "stop"
    assert (reply.usage is not None) and reply.usage.completion_tokens == 60
    # The preempted reply is whole: the same text a request never preempted gets.
    async with client(stack, "batch") as again:
        whole = await again.chat.completions.create(
            model=SIM_MODEL, messages=messages, max_tokens=60
        )
    assert text == whole.choices[0].message.content
    assert await preemptions(stack) == 1
