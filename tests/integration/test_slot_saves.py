"""Saved slot contexts end to end: the openai client -> dataplane -> scheduler -> engine.

The endpoint has one engine slot and two save files (`slots: 1`, `slot_saves: 2`), so every new
turn takes the slot from whoever held it. A scheduler killed and started again learns which run
each file holds from the dataplane's Resync. A paused run's context is saved before another run's
turn takes its slot, and restored before its own next turn; a finished run's is not saved. The
simulated engine answers llama.cpp's slot calls (`--slot-saves`) and logs them in order. An
engine started without them (no `--slot-save-path`) refuses with 501, and the turns still go.
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
from prometheus_client.parser import text_string_to_metric_families

from luftpause.testkit.agents import LOOKUP_TOOL
from luftpause.testkit.stack import SIM_MODEL, LocalStack

ARGS = ("--time-scale", "20", "--tool-rounds", "1")
F0, F1 = "luftpause-engine-0-0.bin", "luftpause-engine-0-1.bin"


async def _stack(exits: AsyncExitStack, workdir: Any, engine_args: tuple[str, ...]) -> LocalStack:
    local = LocalStack(workdir, engine_args=engine_args, engines=1, slots=1, slot_saves=2)
    await local.start(exits)
    await local.wait_healthy()
    return local


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stacks(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[LocalStack, LocalStack]]:
    async with AsyncExitStack() as exits:
        saving = await _stack(exits, tmp_path_factory.mktemp("saves"), (*ARGS, "--slot-saves"))
        plain = await _stack(exits, tmp_path_factory.mktemp("nosaves"), ARGS)
        yield saving, plain


async def turn(client: AsyncOpenAI, run: str, messages: list[Any]) -> bool:
    """One turn of `run`; True when it asked for a tool (whose result is then added)."""
    reply = await client.chat.completions.create(
        model=SIM_MODEL,
        messages=messages,
        tools=LOOKUP_TOOL,
        max_tokens=16,
        extra_headers={"x-luftpause-run-id": run},
    )
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
    return bool(message.tool_calls)


async def play(stack: LocalStack) -> None:
    """a calls a tool, b takes the slot, a answers, b answers."""
    a: list[Any] = [{"role": "user", "content": "task of a " * 40}]
    b: list[Any] = [{"role": "user", "content": "task of b " * 40}]
    async with asyncio.timeout(60), AsyncOpenAI(base_url=stack.base_url, api_key="x") as client:
        assert await turn(client, "run-a", a)
        assert await turn(client, "run-b", b)
        assert not await turn(client, "run-a", a)
        assert not await turn(client, "run-b", b)


async def engine_calls(stack: LocalStack) -> list[tuple[Any, ...]]:
    async with aiohttp.ClientSession() as s, s.get(stack.engine_url(0) + "/debug/requests") as r:
        body = await r.json()
    return [
        ("chat", e["id_slot"])
        if e["path"] == "/v1/chat/completions"
        else (e.get("slot_action"), e.get("id_slot"), e.get("filename"))
        for e in body["requests"]
        if e["path"] == "/v1/chat/completions" or e["path"].startswith("/slots/")
    ]


async def slot_actions(stack: LocalStack) -> dict[str, float]:
    """The dataplane's slot actions by "action outcome", e.g. "save ok"."""
    url = f"http://127.0.0.1:{stack.dataplane_port}/metrics"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        text = await r.text()
    return {
        f"{sample.labels['action']} {sample.labels['outcome']}": sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "luftpause_dataplane_slot_actions"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def counts(
    save_ok: int, save_failed: int, restore_ok: int, restore_failed: int
) -> dict[str, float]:
    return {
        "save ok": save_ok,
        "save failed": save_failed,
        "restore ok": restore_ok,
        "restore failed": restore_failed,
    }


@pytest.mark.asyncio(loop_scope="module")
async def test_a_paused_run_gets_its_context_back_from_its_file(
    stacks: tuple[LocalStack, LocalStack],
) -> None:
    stack = stacks[0]
    await play(stack)
    assert await engine_calls(stack) == [
        ("chat", 0),  # a, into the empty slot
        ("save", 0, F0),  # a is paused on its tool: saved before b takes the slot
        ("chat", 0),
        ("save", 0, F1),  # b is paused: saved to the other file (a's is about to be read)
        ("restore", 0, F0),
        ("chat", 0),  # a answers with its context back; a is done
        ("restore", 0, F1),  # a finished: its context is not saved
        ("chat", 0),
    ]
    assert await slot_actions(stack) == counts(2, 0, 2, 0)
    async with aiohttp.ClientSession() as s, s.get(stack.status_url) as resp:
        [replica] = (await resp.json())["replicas"]
    assert replica["saves"] == [{"file": F0, "run": None}, {"file": F1, "run": None}]
    assert replica["slots"] == [{"slot": 0, "run": "run-b", "busy": False}]


@pytest.mark.asyncio(loop_scope="module")
async def test_an_engine_without_a_save_path_refuses_and_the_turns_still_go(
    stacks: tuple[LocalStack, LocalStack],
) -> None:
    stack = stacks[1]
    await play(stack)
    calls = await engine_calls(stack)
    assert [c for c in calls if c[0] == "chat"] == [("chat", 0)] * 4
    assert await slot_actions(stack) == counts(0, 2, 0, 2)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_restarted_scheduler_learns_the_saved_files_back_from_the_dataplane(
    stacks: tuple[LocalStack, LocalStack],
) -> None:
    """c pauses on a tool, d takes the slot (c's context saved to a file); the scheduler is
    killed and started again, the dataplane resyncs, and c's next turn still gets its context
    back from the file."""
    stack = stacks[0]
    c: list[Any] = [{"role": "user", "content": "task of c " * 40}]
    d: list[Any] = [{"role": "user", "content": "task of d " * 40}]
    async with asyncio.timeout(60), AsyncOpenAI(base_url=stack.base_url, api_key="x") as client:
        assert await turn(client, "run-c", c)
        assert await turn(client, "run-d", d)
        before = await stack.until(holds_c, "c's context saved to a file")
        [file] = [f["file"] for f in before["replicas"][0]["saves"] if f["run"] == "run-c"]
        await stack.procs["scheduler"].kill()
        await stack.launcher.respawn("scheduler")
        await stack.until(holds_c, "the restarted scheduler to know c's file (Resync)")
        calls = len(await engine_calls(stack))
        assert not await turn(client, "run-c", c)
        assert ("restore", 0, file) in (await engine_calls(stack))[calls:]


def holds_c(status: Any) -> bool:
    return any(f["run"] == "run-c" for f in status["replicas"][0]["saves"])
