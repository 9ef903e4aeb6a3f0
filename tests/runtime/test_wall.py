"""The context wall's shell (`wall`) with a real `Runtime`: the engine simulator with a small
context window as its model (reached directly, so its `/v1/models` says the window), the fake
MCP server's `lookup` as the tool, journals in the test's directory, on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from luftpause.runtime.context.wall import ContextWall
from luftpause.runtime.context.windows import Windows, parse_window
from luftpause.runtime.core import compaction
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.errors import TurnError
from luftpause.runtime.journal.file import JournalFile
from luftpause.runtime.loop.llm import Llm
from luftpause.runtime.loop.runtime import Runtime, new_handle
from luftpause.runtime.loop.upstream import Upstreams
from luftpause.runtime.main import parse_args
from luftpause.testkit.engine.params import SimParams
from luftpause.testkit.engine.server import RunningServer, serve
from tests.runtime.loopback import FAST, MODEL, FakeMcp, fake_mcp

WINDOW = 1024
CALLS = 24  # tool calls a run makes: about two windows' worth of rounds
WAIT = 30.0


class CountingLlm(Llm):
    """The real client, counting summary calls; `fail_summaries` makes them fail."""

    def __init__(self, url: str, *, fail_summaries: bool = False) -> None:
        super().__init__(url, timeout=10.0)
        self.summaries = 0
        self.fail_summaries = fail_summaries

    async def turn(self, spec: m.RunSpec, messages: Any, tools: Any, *, calls: bool = True) -> Any:
        if messages[-1].get("content") == compaction.SUMMARY_INSTRUCTION:
            self.summaries += 1
            if self.fail_summaries:
                raise TurnError("the summary model is down")
        return await super().turn(spec, messages, tools, calls=calls)


@pytest.fixture
async def model() -> AsyncIterator[RunningServer]:
    params = SimParams(engine=FAST, time_scale=1000.0, tool_rounds=100, context_window=WINDOW)
    server = await serve(params)
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def tools() -> AsyncIterator[FakeMcp]:
    async with fake_mcp() as fake:
        yield fake


@asynccontextmanager
async def walled(
    state_dir: Path,
    model: RunningServer,
    tools: FakeMcp,
    windows: Callable[[Llm], Windows],
    **llm_kw: Any,
) -> AsyncIterator[tuple[Runtime, CountingLlm]]:
    """A runtime behind the wall, its journal replayed, stopped (unjournaled) on exit."""
    upstreams = Upstreams([tools.url], connect_timeout=5.0)
    upstreams.start()
    llm = CountingLlm(model.url, **llm_kw)
    wall = ContextWall(llm, windows(llm), keep_rounds=2, summary_tokens=200)
    runtime = Runtime(JournalFile(state_dir), llm, upstreams, wall=wall)
    runtime.resume()
    try:
        yield runtime, llm
    finally:
        await runtime.stop()
        await upstreams.close()
        await llm.close()


def spec(task: str = "look up every river") -> m.RunSpec:
    return m.RunSpec(
        handle=new_handle(),
        model=MODEL,
        task=task,
        tools=("lookup",),
        max_tool_calls=CALLS,
        max_tokens=64,
    )


async def finished(runtime: Runtime, handle: str) -> dict[str, Any]:
    [out] = await runtime.await_runs([handle], "all", WAIT)
    assert out["state"] == "finished", out
    return out


def records(state_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in JournalFile(state_dir).open() if r["type"] == kind]


def listed(llm: Llm) -> Windows:
    return Windows(llm)


async def test_a_long_run_on_a_small_window_finishes_with_its_history_summarised(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with walled(tmp_path, model, tools, listed) as (runtime, llm):
        handle = await runtime.spawn(spec())
        out = await finished(runtime, handle)
        messages = runtime.runs[handle].state.messages
    assert out["toolCalls"] == CALLS and out["failedToolCalls"] == 0
    compacted = records(tmp_path, "compacted")
    assert compacted and all(r["summary"] for r in compacted)
    assert all(r["window"] == WINDOW and r["estimate"] + 64 > WINDOW for r in compacted)
    assert llm.summaries == len(compacted)
    # Each compaction took up where the one before ended; the task stays first.
    firsts = [r["rounds"][0] for r in compacted]
    assert firsts[0] == 1 and firsts[1:] == [r["rounds"][1] + 1 for r in compacted[:-1]]
    assert messages[0]["content"] == "look up every river"
    assert messages[1]["content"].startswith("[Summary of rounds 1-")
    assert "Notes on" in messages[1]["content"]
    assert compaction.text_tokens(messages, ()) + 64 <= WINDOW


async def test_a_restart_replays_the_compaction_and_never_summarises_those_rounds_again(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    first = tmp_path / "first"
    async with walled(first, model, tools, listed) as (runtime, _):
        handle = await runtime.spawn(spec())
        await finished(runtime, handle)
    # The journal as a crash right after the first compaction would have left it.
    lines = (first / "runs.jsonl").read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if b'"type":"compacted"' in line)
    again = tmp_path / "again"
    again.mkdir()
    (again / "runs.jsonl").write_bytes(b"".join(lines[: cut + 1]))
    [before] = records(again, "compacted")
    async with walled(again, model, tools, listed) as (runtime, llm):
        out = await finished(runtime, handle)
    later = records(again, "compacted")[1:]
    assert out["toolCalls"] == CALLS
    assert llm.summaries == len(later)
    assert all(r["rounds"][0] == before["rounds"][1] + 1 for r in later[:1])


async def test_without_a_known_window_the_engines_refusal_teaches_it(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with walled(tmp_path, model, tools, lambda llm: Windows()) as (runtime, _):
        handle = await runtime.spawn(spec())
        out = await finished(runtime, handle)
        window = await runtime.wall.windows.of(MODEL)
    assert out["toolCalls"] == CALLS and window == WINDOW
    assert model.sim.rejected_total == 1  # once refused, the window is known from then on
    compacted = records(tmp_path, "compacted")
    assert compacted and all(r["window"] == WINDOW for r in compacted)


async def test_when_no_summary_can_be_made_the_oldest_rounds_are_dropped(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with walled(tmp_path, model, tools, listed, fail_summaries=True) as (runtime, llm):
        handle = await runtime.spawn(spec())
        out = await finished(runtime, handle)
        messages = runtime.runs[handle].state.messages
    compacted = records(tmp_path, "compacted")
    assert out["toolCalls"] == CALLS and compacted and llm.summaries == len(compacted)
    assert all(r["summary"] is None for r in compacted)
    assert "were dropped" in messages[1]["content"] and messages[0]["content"].startswith("look")


async def test_a_run_whose_task_alone_is_too_long_fails_with_the_engines_error(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with walled(tmp_path, model, tools, listed) as (runtime, _):
        handle = await runtime.spawn(spec(task="rivers " * 2000))
        async with asyncio.timeout(WAIT):
            [out] = await runtime.await_runs([handle], "all", WAIT)
    assert out["state"] == "failed" and "context_length_exceeded" in out["error"]
    assert records(tmp_path, "compacted") == []


def test_a_context_window_is_n_or_model_n() -> None:
    assert parse_window("8192") == (None, 8192)
    assert parse_window("org/model=4096") == ("org/model", 4096)
    for bad in ("", "x", "=5", "m=0", "m=-1", "m=big"):
        with pytest.raises(ValueError, match="N or MODEL=N"):
            parse_window(bad)


async def test_a_models_window_is_the_smallest_known() -> None:
    windows = Windows(None, [(None, 8000), ("big", 32000)])
    assert await windows.of("big") == 32000 and await windows.of("other") == 8000
    windows.learn("big", 16000)
    assert await windows.of("big") == 16000
    assert await Windows().of("any") is None


def test_the_runtime_takes_windows_keep_rounds_and_summary_tokens_from_flags_and_env() -> None:
    config = parse_args(
        ["--context-window", "8192", "--context-window", "qwen=32768", "--keep-rounds", "2"],
        {"LUFTPAUSE_SUMMARY_TOKENS": "512", "LUFTPAUSE_APPROVALS_PER_HOUR": "0"},
    )
    assert config.context_windows == ((None, 8192), ("qwen", 32768))
    assert (config.keep_rounds, config.summary_tokens, config.approvals_per_hour) == (2, 512, 0)
    defaults = parse_args([], {})
    assert (defaults.keep_rounds, defaults.summary_tokens, defaults.approvals_per_hour) == (
        4,
        1024,
        20,
    )
    for bad in (
        ["--context-window", "m=0"],
        ["--keep-rounds", "-1"],
        ["--approvals-per-hour", "x"],
    ):
        with pytest.raises(SystemExit):
            parse_args(bad, {})
