"""A preemptive engine end to end: the openai client -> dataplane -> scheduler -> engine.

The simulated engine runs one request at a time and, as SGLang with priority scheduling does,
preempts a running request for a waiting one whose priority is better by more than 10. The
endpoint file says so (`preemptive: true`), and gives batch 100 and interactive 0. An
interactive turn sent while a batch turn streams finishes first; the batch turn's stream stalls
meanwhile and then goes on to its end, every token in order, on the same connection.
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

ENGINE_ARGS = (
    "--time-scale",
    "5",
    "--max-running",
    "1",
    "--reply-tokens",
    "60",
    "--tool-rounds",
    "0",
    "--priority-scheduling",
    "low-first",
    "--priority-preemption-threshold",
    "10",
)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalStack]:
    workdir: Path = tmp_path_factory.mktemp("preemption")
    async with AsyncExitStack() as exits:
        local = LocalStack(
            workdir, engine_args=ENGINE_ARGS, engines=1, priority=(0, 100), preemptive=True
        )
        await local.start(exits)
        await local.wait_healthy()
        yield local


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
    stack: LocalStack,
) -> None:
    messages: Any = [{"role": "user", "content": "work"}]
    done: list[str] = []

    def client(cls: str) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=stack.base_url,
            api_key="x",
            max_retries=0,
            timeout=60,
            default_headers={"x-luftpause-class": cls},
        )

    async with asyncio.timeout(60), client("batch") as batch, client("interactive") as inter:
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
    async with client("batch") as again:
        whole = await again.chat.completions.create(
            model=SIM_MODEL, messages=messages, max_tokens=60
        )
    assert text == whole.choices[0].message.content
    assert await preemptions(stack) == 1
