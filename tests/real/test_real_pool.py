"""The real pool: one llama.cpp engine serving Gemma 3 270M answers a tool-calling turn, keeps
each run's context in the slot the scheduler names (endpoint `slots`), and gets a paused run's
context back from the file it was saved to when another run took its slot (`slot_saves`).

Marked real_engine: `make test` skips it, `make test-real` installs the `real` extra and runs
it (alone: `.venv/bin/pytest -m real_engine tests/real/test_real_pool.py`), inside
`flock /tmp/luftpause-bench.lock` when benchmarks share the machine.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from bench.arms import start_front
from bench.real_pool import MODEL, start_real_engines
from luftpause.testkit.agents import LOOKUP_TOOL
from luftpause.testkit.preambles import GEMMA_PREAMBLE

pytestmark = pytest.mark.real_engine
pytest.importorskip("xllamacpp")


async def test_one_engine_answers_a_turn_with_a_parsed_tool_call(tmp_path: Path) -> None:
    async with AsyncExitStack() as exits:
        [url] = await start_real_engines(exits, tmp_path, n=1)
        async with AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
            reply = await client.chat.completions.create(
                model=MODEL,
                messages=[
                    *GEMMA_PREAMBLE,  # type: ignore[list-item]
                    {"role": "user", "content": "Task: how deep is Lake Geneva? Look up facts."},
                ],
                tools=LOOKUP_TOOL,
                max_tokens=40,
                temperature=0.0,
                stop=["</tool_call>"],
                timeout=60,
            )
        async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
            metrics = await resp.text()
    calls = reply.choices[0].message.tool_calls or []
    assert calls and calls[0].type == "function" and calls[0].function.name == "lookup"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    # The names the scheduler's prober reads for llama.cpp's load.
    assert "llamacpp:requests_processing" in metrics
    assert "llamacpp:requests_deferred" in metrics


async def _turn(client: AsyncOpenAI, run: str, messages: list[Any]) -> tuple[int, int]:
    """One turn of `run` (its reply joins `messages`): (prompt tokens, cached prompt tokens)."""
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        temperature=0.0,
        extra_headers={"x-luftpause-run-id": run},
        timeout=120,
    )
    messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    messages.append({"role": "user", "content": "Go on."})
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0


async def test_slots_named_by_the_scheduler_keep_a_runs_context_in_llama_cpp(
    tmp_path: Path,
) -> None:
    # Two slots, three runs: c is new when a and b have both had a turn, and the scheduler
    # gives it a's slot (a was active longest ago), so b's next turn finds its context and
    # a's does not. llama.cpp left to itself picks by prefix similarity, which for runs that
    # share a preamble is near a tie.
    async with AsyncExitStack() as exits:
        [url] = await start_real_engines(exits, tmp_path, n=1, parallel=2)
        front = (await start_front(exits, tmp_path, "luftpause", [url], MODEL, 0.5, slots=2)).url
        convs = {
            run: [*GEMMA_PREAMBLE, {"role": "user", "content": f"Task: {run} " + text * 40}]
            for run, text in (
                ("a", "Tell me about rivers. "),
                ("b", "Tell me about lakes. "),
                ("c", "Tell me about hills. "),
            )
        }
        async with AsyncOpenAI(base_url=front + "/v1", api_key="x", max_retries=0) as client:
            a1, _ = await _turn(client, "a", convs["a"])
            b1, _ = await _turn(client, "b", convs["b"])
            await _turn(client, "c", convs["c"])
            _, b2_cached = await _turn(client, "b", convs["b"])
            _, a2_cached = await _turn(client, "a", convs["a"])
    assert b2_cached >= 0.9 * b1, (b1, b2_cached)
    assert a2_cached < 0.9 * a1, (a1, a2_cached)


async def _tool_turn(client: AsyncOpenAI, run: str, messages: list[Any]) -> tuple[int, int, bool]:
    """One tool-calling turn of `run`: (prompt tokens, cached prompt tokens, it called a tool).
    The reply and a tool result for each call join `messages`."""
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=LOOKUP_TOOL,
        max_tokens=40,
        temperature=0.0,
        stop=["</tool_call>"],
        extra_headers={"x-luftpause-run-id": run},
        timeout=120,
    )
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "310 metres"})
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return usage.prompt_tokens, cached, bool(message.tool_calls)


@pytest.mark.parametrize("saves", [2, 0])
async def test_a_paused_runs_context_comes_back_from_its_saved_file(
    tmp_path: Path, saves: int
) -> None:
    # One slot. a calls a tool; b's turn takes the slot; with `slot_saves` the dataplane saved
    # a's context first and restores it before a's next turn, which then reads only the new
    # tool result. Without, a reads its whole task again (the shared preamble aside).
    async with AsyncExitStack() as exits:
        [url] = await start_real_engines(exits, tmp_path, n=1, parallel=1)
        front = (
            await start_front(
                exits, tmp_path, "luftpause", [url], MODEL, 0.5, slots=1, slot_saves=saves
            )
        ).url
        convs = {
            run: [
                *GEMMA_PREAMBLE,
                {"role": "user", "content": f"Task: {question} Look up facts. " + notes * 30},
            ]
            for run, question, notes in (
                ("a", "how deep is Lake Geneva?", "Notes on lakes and their depth. "),
                ("b", "how long is the Rhine?", "Notes on rivers and their length. "),
            )
        }
        async with AsyncOpenAI(base_url=front + "/v1", api_key="x", max_retries=0) as client:
            a1, _, a_called = await _tool_turn(client, "a", convs["a"])
            _, _, b_called = await _tool_turn(client, "b", convs["b"])
            assert a_called and b_called, "the model answered without a tool call"
            _, a2_cached, _ = await _tool_turn(client, "a", convs["a"])
        async with aiohttp.ClientSession() as http, http.get(front + "/metrics") as resp:
            metrics = await resp.text()
    if saves:
        assert a2_cached >= 0.9 * a1, (a1, a2_cached)
        assert 'luftpause_dataplane_slot_actions_total{action="restore",outcome="ok"} 1.0' in (
            metrics
        )
    else:
        assert a2_cached < 0.9 * a1, (a1, a2_cached)
