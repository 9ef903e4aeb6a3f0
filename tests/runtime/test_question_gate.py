"""The attention budget's shell (`question_gate`) with `elicitation`: a real `Runtime` (the engine
simulator as its model, the fake MCP server's destructive `delete_record` as the tool that needs
approval, on 127.0.0.1) and the official `mcp` client on the server's in-memory connection, in
both protocol eras.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from luftpause.runtime.core import attention
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.file import JournalFile
from luftpause.runtime.loop.runtime import Runtime, new_handle
from luftpause.runtime.people.question_gate import ATTENTION_NAME, Questions, parse_switch
from luftpause.runtime.server.app import build_server
from luftpause.testkit.engine.server import RunningServer
from tests.runtime.loopback import MODEL, FakeMcp, runtime_on
from tests.runtime.test_elicitation import answering

WAIT = 10.0
ERAS = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])


def budget(runtime: Runtime, per_hour: int, window: float = attention.WINDOW) -> None:
    runtime.questions = Questions(per_hour, clock=runtime.clock, window=window)


async def waiting(runtime: Runtime, n: int = 1) -> list[str]:
    """`n` runs, each waiting for the approval of its delete_record call, the longest waiting
    first."""
    handles = []
    for i in range(n):
        spec = m.RunSpec(
            handle=new_handle(), task=f"tidy {i}", model=MODEL, tools=("delete_record",)
        )
        handles.append(await runtime.spawn(spec))
    async with asyncio.timeout(WAIT):
        while len(runtime.approvals.pending(handles)) < n:
            await asyncio.sleep(0.01)
    return [h for h, _ in runtime.approvals.pending(handles)]


async def tool(c: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await c.call_tool(name, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def client(runtime: Runtime, mode: str, asked: list[str] | None = None) -> Client:
    callback = None if asked is None else answering(True, asked)
    return Client(
        build_server(runtime, default_model=MODEL), mode=mode, elicitation_callback=callback
    )


@ERAS
async def test_past_the_budget_a_question_waits_unasked_and_status_lists_it(
    runtime: Runtime, mode: str
) -> None:
    budget(runtime, 1)
    first, second = await waiting(runtime, 2)
    asked: list[str] = []
    async with asyncio.timeout(WAIT), client(runtime, mode, asked) as c:
        out = await tool(c, "await", {"handles": [first, second], "timeout": 1})
        status = await tool(c, "status", {})
    assert len(asked) == 1 and first in asked[0]  # the older one
    states = {r["handle"]: r["state"] for r in out["runs"]}
    assert states[second] == "AwaitingApproval"
    [question] = status["questions"]
    assert question["handle"] == second and question["tool"] == "delete_record"
    assert "record_id" in question["arguments"] and question["since"] > 0
    assert status["attention"]["perHour"] == 1 and status["attention"]["askedLastHour"] == 1
    assert status["attention"]["mayAsk"] is False and status["attention"]["nextAskAt"] > 0


@ERAS
async def test_a_held_question_is_asked_once_the_budget_frees(runtime: Runtime, mode: str) -> None:
    budget(runtime, 1, window=0.5)
    handles = await waiting(runtime, 2)
    asked: list[str] = []
    async with asyncio.timeout(WAIT), client(runtime, mode, asked) as c:
        out = await tool(c, "await", {"handles": handles, "timeout": 8})
    assert len(asked) == 2 and handles[0] in asked[0] and handles[1] in asked[1]
    assert [r["state"] for r in out["runs"]] == ["finished", "finished"]


@ERAS
async def test_a_budget_of_zero_asks_nothing_and_approve_still_answers(
    runtime: Runtime, mode: str
) -> None:
    budget(runtime, 0)
    [handle] = await waiting(runtime)
    asked: list[str] = []
    async with asyncio.timeout(WAIT), client(runtime, mode, asked) as c:
        waited = asyncio.create_task(c.call_tool("await", {"handles": [handle], "timeout": 8}))
        status = await tool(c, "status", {"handles": [handle]})
        await tool(c, "approve", {"handle": handle, "allow": True})
        result = await waited
    assert asked == [] and [q["handle"] for q in status["questions"]] == [handle]
    assert result.structured_content is not None
    assert result.structured_content["runs"][0]["state"] == "finished"


@ERAS
async def test_away_holds_the_question_until_it_is_switched_off(
    runtime: Runtime, mode: str
) -> None:
    [handle] = await waiting(runtime)
    asked: list[str] = []
    async with asyncio.timeout(WAIT), client(runtime, mode, asked) as c:
        away = await tool(c, "away", {"on": True})
        held = await tool(c, "await", {"handles": [handle], "timeout": 0.5})
        assert asked == [] and held["runs"][0]["state"] == "AwaitingApproval"
        waited = asyncio.create_task(c.call_tool("await", {"handles": [handle], "timeout": 8}))
        back = await tool(c, "away", {"on": False})
        result = await waited
    assert away["away"] is True and away["mayAsk"] is False and back["away"] is False
    assert len(asked) == 1 and handle in asked[0]
    assert result.structured_content is not None
    assert result.structured_content["runs"][0]["state"] == "finished"


async def test_away_is_per_session_and_the_switch_for_everyone_holds_all(
    runtime: Runtime,
) -> None:
    questions = runtime.questions
    await questions.set_away("alice", True)
    assert questions.view("alice")["away"] and not questions.view("bob")["away"]
    await questions.set_away(attention.EVERYONE, True)
    assert questions.view("bob")["away"] and questions.view("bob")["awayEveryone"]
    assert questions.switches() == {"everyone": True, "sessions": ["alice"], "perHour": 20}


async def test_away_with_a_bad_argument_is_a_clear_tool_error(runtime: Runtime) -> None:
    async with asyncio.timeout(WAIT), client(runtime, "legacy") as c:
        result = await c.call_tool("away", {"on": "maybe"})
        missing = await c.call_tool("away", {})
    assert result.is_error and "on" in str(result.content) and "bool" in str(result.content)
    assert missing.is_error and "on" in str(missing.content)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"on": true}', (attention.EVERYONE, True)),
        (b'{"on": false, "session": "abc"}', ("abc", False)),
    ],
)
def test_the_away_route_takes_on_and_an_optional_session(
    body: bytes, expected: tuple[str, bool]
) -> None:
    assert parse_switch(body) == expected


@pytest.mark.parametrize(
    "body", [b"", b"not json", b'{"on": "yes"}', b"[true]", b'{"on": true, "session": ""}']
)
def test_the_away_route_refuses_a_body_that_does_not_fit(body: bytes) -> None:
    with pytest.raises(ValueError, match=r"on|session|JSON"):
        parse_switch(body)


async def test_an_answer_journaled_before_a_restart_is_never_asked_again(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    spec = m.RunSpec(
        handle=new_handle(),
        task="search",
        model=MODEL,
        tools=("deep_search",),
        approve_tools=("deep_search",),
    )
    async with runtime_on(tmp_path, model.url, [tools.url]) as first:
        await first.spawn(spec)
        async with asyncio.timeout(WAIT):
            while not first.approvals.pending([spec.handle]):
                await asyncio.sleep(0.01)
        await first.approve(spec.handle, True)  # journaled; deep_search then runs for 5 s
    async with runtime_on(tmp_path, model.url, [tools.url]) as again:
        asked: list[str] = []
        async with asyncio.timeout(WAIT), client(again, "legacy", asked) as c:
            out = await tool(c, "await", {"handles": [spec.handle], "timeout": 9})
    assert asked == [] and out["runs"][0]["state"] == "finished"
    assert out["runs"][0]["failedToolCalls"] == 0


# --- journaled: a restart keeps the hour's asks and the switches ---


class Clock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


class Shown:
    """A pending approval as `Questions` sees it."""

    def __init__(self, call_id: str) -> None:
        self.call = m.ToolCall(id=call_id, name="delete_record", arguments="{}")
        self.since = 0.0


def journaled(state_dir: Path, clock: Clock, per_hour: int = 2) -> Questions:
    questions = Questions(
        per_hour, clock=clock, journal_file=JournalFile(state_dir, ATTENTION_NAME)
    )
    questions.resume()
    return questions


async def test_the_hours_asks_and_the_away_switches_survive_a_restart(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    first = journaled(tmp_path, clock)
    assert await first.ask("alice", "run-1", Shown("c1")) is None
    clock.at = 1010.0
    assert await first.ask("alice", "run-2", Shown("c2")) is None
    await first.set_away("bob", True)
    await first.set_away(attention.EVERYONE, True)
    await first.set_away(attention.EVERYONE, False)
    assert first.journal is not None
    first.journal.close()

    clock.at = 1020.0
    again = journaled(tmp_path, clock)
    held = await again.ask("alice", "run-3", Shown("c3"))
    assert held == attention.Hold(reason="budget", until=1000.0 + attention.WINDOW)
    assert again.view("alice")["askedLastHour"] == 2 and again.view("bob")["away"]
    assert again.switches() == {"everyone": False, "sessions": ["bob"], "perHour": 2}
    assert await again.ask("alice", "run-1", Shown("c1")) is None  # shown again: paid for
    assert again.journal is not None
    again.journal.close()
    # Compacted on start: the two asks and bob's switch, not every record ever written.
    lines = (tmp_path / "attention.jsonl").read_text().splitlines()
    assert len(lines) == 3


async def test_an_hour_later_the_replayed_asks_no_longer_count(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    first = journaled(tmp_path, clock, per_hour=1)
    await first.ask("alice", "run-1", Shown("c1"))
    assert first.journal is not None
    first.journal.close()
    clock.at = 1000.0 + attention.WINDOW + 1
    again = journaled(tmp_path, clock, per_hour=1)
    assert await again.ask("alice", "run-2", Shown("c2")) is None
