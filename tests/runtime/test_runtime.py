"""`loop.runtime.Runtime` on its own: real runs with a real journal, a real `Llm` against the engine
simulator and real upstream sessions to the fake MCP server, all on 127.0.0.1 in this process.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from luftpause.runtime.core import forks
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.errors import RequestError
from luftpause.runtime.journal.file import JOURNAL_NAME
from luftpause.runtime.loop import llm
from luftpause.runtime.loop.runtime import Runtime, new_handle
from luftpause.runtime.loop.toolcalls import DECLINED
from luftpause.testkit.engine.server import RunningServer
from tests.runtime.loopback import MODEL, FakeMcp, closed_port, engine, fake_mcp, runtime_on

WAIT = 10.0
ROUNDS = 2  # the simulated model calls the first offered tool this many times, then answers


def spec(task: str = "find otters", **kw: Any) -> m.RunSpec:
    kw.setdefault("tools", ("lookup",))
    return m.RunSpec(handle=new_handle(), task=task, model=MODEL, **kw)


def records(state_dir: Path) -> list[dict[str, Any]]:
    """The journal's records, batches taken apart."""
    lines = (state_dir / JOURNAL_NAME).read_text().splitlines()
    return list(forks.expand(json.loads(line) for line in lines))


async def until(check: Any) -> None:
    async with asyncio.timeout(WAIT):
        while not check():
            await asyncio.sleep(0.01)


@pytest.fixture
async def model() -> AsyncIterator[RunningServer]:
    async with engine(tool_rounds=ROUNDS) as server:
        yield server


@pytest.fixture
async def tools() -> AsyncIterator[FakeMcp]:
    async with fake_mcp(deep_search=0.5) as fake:
        yield fake


@pytest.fixture
async def runtime(tmp_path: Path, model: RunningServer, tools: FakeMcp) -> AsyncIterator[Runtime]:
    async with runtime_on(tmp_path, model.url, [tools.url]) as rt:
        yield rt


async def finish(runtime: Runtime, handle: str) -> dict[str, Any]:
    [summary] = await runtime.await_runs([handle], "all", WAIT)
    assert summary["state"] in ("finished", "failed", "cancelled"), summary
    return summary


async def test_a_run_calls_its_tool_each_round_then_finishes_with_the_models_answer(
    runtime: Runtime, tools: FakeMcp, tmp_path: Path
) -> None:
    handle = await runtime.spawn(spec())
    summary = await finish(runtime, handle)
    assert summary["state"] == "finished" and summary["result"], summary
    assert (summary["toolCalls"], summary["failedToolCalls"], summary["turns"]) == (2, 0, 3)
    assert tools.stats.calls["lookup"] == ROUNDS
    kinds = [r["type"] for r in records(tmp_path) if r["run"] == handle]
    assert kinds == ["spawned", *["turn", "call", "round"] * ROUNDS, "finished"]


async def test_a_finished_run_answers_from_the_journal_after_a_restart(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with runtime_on(tmp_path, model.url, [tools.url]) as first:
        handle = await first.spawn(spec())
        before = await finish(first, handle)
    async with runtime_on(tmp_path, model.url, [tools.url], resume=False) as second:
        assert second.resume() == 0  # nothing left to run
        after = second.summary(handle)
    assert after == before
    assert tools.stats.calls["lookup"] == ROUNDS  # no tool called again


async def test_a_run_stopped_mid_tool_call_resumes_from_the_journal_and_finishes(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with runtime_on(tmp_path, model.url, [tools.url]) as first:
        handle = await first.spawn(spec(tools=("deep_search",)))
        await until(lambda: tools.stats.in_flight["deep_search"] == 1)
    # The call was journaled before it left; stopping journals nothing more.
    assert [r["type"] for r in records(tmp_path)] == ["spawned", "turn", "call"]
    async with runtime_on(tmp_path, model.url, [tools.url], resume=False) as second:
        assert second.resume() == 1
        summary = await finish(second, handle)
    assert summary["state"] == "finished" and summary["toolCalls"] == ROUNDS
    # deep_search is read-only: sent again with the same key, not reported as unknown.
    assert summary["failedToolCalls"] == 0
    first_call = records(tmp_path)[2]
    assert [r for r in records(tmp_path) if r["type"] == "call"][1] == first_call | {"attempt": 2}


async def test_await_any_returns_when_the_first_run_ends_and_all_waits_for_every_run(
    runtime: Runtime,
) -> None:
    quick = await runtime.spawn(spec())
    slow = await runtime.spawn(spec(tools=("deep_search",)))
    first = await runtime.await_runs([slow, quick], "any", WAIT)
    assert [s["state"] for s in first] == ["tools", "finished"]
    both = await runtime.await_runs([slow, quick], "all", WAIT)
    assert [s["state"] for s in both] == ["finished", "finished"]


async def test_await_returns_at_its_timeout_while_the_run_goes_on(runtime: Runtime) -> None:
    handle = await runtime.spawn(spec(tools=("deep_search",)))
    [summary] = await runtime.await_runs([handle], "all", 0.05)
    assert summary["state"] in ("running", "tools")
    task = runtime.runs[handle].task
    assert task is not None and not task.done()


async def test_an_unknown_handle_is_summarised_as_unknown_and_awaited_without_waiting(
    runtime: Runtime,
) -> None:
    async with asyncio.timeout(1):
        [summary] = await runtime.await_runs(["run-nope"], "all", 30)
    assert summary == {"handle": "run-nope", "state": "unknown", "error": "no run run-nope"}


async def test_a_child_run_is_listed_under_its_parent(runtime: Runtime) -> None:
    parent = await runtime.spawn(spec(tools=("deep_search",)))
    child = await runtime.spawn(spec("child", parent=parent))
    await finish(runtime, child)
    assert runtime.summary(parent)["children"] == [child]
    assert runtime.summary(child)["parent"] == parent
    assert runtime.descendants(parent) == [child]


async def test_spawning_under_an_unknown_parent_is_refused_and_nothing_is_journaled(
    runtime: Runtime, tmp_path: Path
) -> None:
    with pytest.raises(RequestError, match="unknown parent run run-nope"):
        await runtime.spawn(spec(parent="run-nope"))
    assert runtime.runs == {} and records(tmp_path) == []


async def test_cancel_ends_a_run_and_its_running_descendants_as_cancelled(
    runtime: Runtime, tmp_path: Path
) -> None:
    parent = await runtime.spawn(spec(tools=("deep_search",)))
    child = await runtime.spawn(spec("child", parent=parent, tools=("deep_search",)))
    cancelled = await runtime.cancel(parent)
    assert cancelled == [parent, child]
    states = [s["state"] for s in await runtime.await_runs([parent, child], "all", WAIT)]
    assert states == ["cancelled", "cancelled"]
    ended = [r for r in records(tmp_path) if r["type"] == "finished"]
    assert {(r["run"], r["state"]) for r in ended} == {(parent, "cancelled"), (child, "cancelled")}
    assert await runtime.cancel(parent) == []  # already over: nothing more to cancel


async def test_cancel_of_an_unknown_run_says_there_is_no_such_run(runtime: Runtime) -> None:
    with pytest.raises(RequestError, match="no run run-nope"):
        await runtime.cancel("run-nope")


async def test_a_destructive_tool_call_waits_for_approval_and_a_decline_reaches_the_model(
    runtime: Runtime, tools: FakeMcp, tmp_path: Path
) -> None:
    handle = await runtime.spawn(spec(tools=("delete_record",)))
    await until(lambda: runtime.runs[handle].state.phase is m.Phase.AWAITING_APPROVAL)
    assert runtime.summary(handle)["pendingApproval"]["tool"] == "delete_record"
    [(waiting, approval)] = runtime.approvals.pending([handle])
    assert waiting == handle and approval.call.name == "delete_record"

    answer = await runtime.approve(handle, False)

    assert answer == {"handle": handle, "tool": "delete_record", "allow": False}
    decided = [r for r in records(tmp_path) if r["type"] == "approval"]
    assert [(r["tool"], r["allow"]) for r in decided] == [("delete_record", False)]
    # The model asks again in its next round; decline that one too, then it answers.
    await until(lambda: runtime.runs[handle].state.phase is m.Phase.AWAITING_APPROVAL)
    await runtime.approve(handle, False)
    summary = await finish(runtime, handle)
    assert summary["state"] == "finished" and summary["failedToolCalls"] == ROUNDS
    assert tools.stats.calls["delete_record"] == 0  # a declined call never reaches the server
    tool_messages = [msg for msg in runtime.runs[handle].state.messages if msg["role"] == "tool"]
    assert [msg["content"] for msg in tool_messages] == [DECLINED, DECLINED]


async def test_an_approved_tool_call_reaches_the_server(runtime: Runtime, tools: FakeMcp) -> None:
    handle = await runtime.spawn(spec(tools=("lookup",), approve_tools=("lookup",)))
    for _ in range(ROUNDS):
        await until(lambda: runtime.approvals.pending([handle]) != [])
        await runtime.approve(handle, True)
    summary = await finish(runtime, handle)
    assert summary["state"] == "finished" and summary["failedToolCalls"] == 0
    assert tools.stats.calls["lookup"] == ROUNDS


async def test_approve_says_why_when_there_is_nothing_to_approve(runtime: Runtime) -> None:
    with pytest.raises(RequestError, match="no run run-nope"):
        await runtime.approve("run-nope", True)
    handle = await runtime.spawn(spec(tools=("delete_record",)))
    await until(lambda: runtime.approvals.pending([handle]) != [])
    with pytest.raises(RequestError, match="is not waiting for tool call call-other"):
        await runtime.approve(handle, True, call_id="call-other")
    await runtime.cancel(handle)
    with pytest.raises(RequestError, match="is not waiting for an approval"):
        await runtime.approve(handle, True)


async def test_a_tool_call_budget_cancels_the_run_with_the_reason(
    runtime: Runtime, tmp_path: Path
) -> None:
    handle = await runtime.spawn(spec(budget_tool_calls=1))
    summary = await finish(runtime, handle)
    assert summary["state"] == "cancelled"
    assert summary["error"] == "budget exceeded: toolCalls 2/1"
    assert summary["budget"]["exceeded"]["which"] == "toolCalls"
    assert [r["which"] for r in records(tmp_path) if r["type"] == "exceeded"] == ["toolCalls"]


async def test_a_child_cannot_be_spawned_under_a_parent_past_its_budget(
    runtime: Runtime,
) -> None:
    parent = await runtime.spawn(spec(budget_tool_calls=1))
    await finish(runtime, parent)
    with pytest.raises(RequestError, match="parent's budget exceeded"):
        await runtime.spawn(spec("child", parent=parent))


async def test_the_tools_are_the_upstream_catalogue_described(runtime: Runtime) -> None:
    described = {t["name"]: t for t in await runtime.tools()}
    assert set(described) == {"lookup", "deep_search", "delete_record", "charge", "set_status"}
    assert described["delete_record"]["destructive"] is True
    assert described["lookup"]["destructive"] is False
    assert described["lookup"]["resendable"] and described["set_status"]["resendable"]
    assert not described["charge"]["resendable"] and not described["delete_record"]["resendable"]


async def test_a_model_that_cannot_be_reached_fails_the_run_with_the_reason(
    tmp_path: Path, tools: FakeMcp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm, "BACKOFF", 0.01)  # the retries' backoff, not their number
    unreachable = f"http://127.0.0.1:{closed_port()}"
    async with runtime_on(tmp_path, unreachable, [tools.url]) as runtime:
        handle = await runtime.spawn(spec())
        summary = await finish(runtime, handle)
    assert summary["state"] == "failed"
    assert "ClientConnectorError: Cannot connect to host" in summary["error"], summary
    assert unreachable.removeprefix("http://") in summary["error"], summary
    assert [r["state"] for r in records(tmp_path) if r["type"] == "finished"] == ["failed"]


async def test_a_stop_lets_a_call_in_flight_return_and_be_journaled_first(
    tmp_path: Path, model: RunningServer
) -> None:
    """charge is not idempotent: stopped mid-call without a grace its outcome would be unknown
    on resume. With one, it returns, its round is journaled, and the run goes on from there."""
    async with fake_mcp(write=0.5) as charging:
        async with runtime_on(tmp_path, model.url, [charging.url]) as first:
            handle = await first.spawn(spec(tools=("charge",)))
            await until(lambda: charging.stats.in_flight["charge"] == 1)
            await first.stop(grace=WAIT)
            kinds = [r["type"] for r in records(tmp_path)]
        assert kinds == ["spawned", "turn", "call", "round"]  # and no second turn began
        async with runtime_on(tmp_path, model.url, [charging.url]) as second:
            summary = await finish(second, handle)
    assert summary["state"] == "finished" and summary["failedToolCalls"] == 0
    assert charging.stats.calls["charge"] == ROUNDS


async def test_a_call_cut_by_a_stop_without_grace_is_not_sent_again_and_the_model_is_told(
    tmp_path: Path, model: RunningServer
) -> None:
    async with fake_mcp(write=1.0) as charging:
        async with runtime_on(tmp_path, model.url, [charging.url]) as first:
            handle = await first.spawn(spec(tools=("charge",)))
            await until(lambda: charging.stats.in_flight["charge"] == 1)
        async with runtime_on(tmp_path, model.url, [charging.url]) as second:
            summary = await finish(second, handle)
            told = second.runs[handle].state.messages[2]["content"]
    assert summary["state"] == "finished" and summary["failedToolCalls"] == 1
    assert "may or may not have run (the runtime stopped while the call was in flight)" in told
    assert charging.stats.calls["charge"] == ROUNDS  # the cut one and the next round's: never twice
