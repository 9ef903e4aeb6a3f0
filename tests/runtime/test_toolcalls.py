"""`toolcalls`: one call until it has a result, through `resend`'s rule, against scripted
outcomes of each send (no network); the run's side is a recorder."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from luftpause.runtime.core import machine as m
from luftpause.runtime.core.resend import Outcome
from luftpause.runtime.loop.toolcalls import DECLINED, ToolCaller
from luftpause.runtime.loop.upstream import Attempt, Upstreams, UpstreamTool

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def tool(name: str, hints: ToolAnnotations | None = None) -> UpstreamTool:
    annotations = ToolAnnotations() if hints is None else hints
    spec = Tool(name=name, input_schema=SCHEMA, annotations=annotations)
    return UpstreamTool(server="memory", tool=spec)


OFFERED = {
    "charge": tool("charge"),
    "set_status": tool("set_status", ToolAnnotations(idempotent_hint=True)),
    "lookup": tool("lookup", ToolAnnotations(read_only_hint=True)),
}


def call(name: str, arguments: str = '{"n": 1}') -> m.ToolCall:
    return m.ToolCall(id="c1", name=name, arguments=arguments)


def answered(text: str = "done") -> Attempt:
    return Attempt(
        outcome=Outcome.ANSWERED, result=CallToolResult(content=[TextContent(text=text)])
    )


UNKNOWN = Attempt(outcome=Outcome.UNKNOWN, why="the session broke")
NOT_SENT = Attempt(outcome=Outcome.NOT_SENT, why="connection refused")
TIMED_OUT = Attempt(outcome=Outcome.UNKNOWN, why="no answer in time")


class Script:
    """Upstreams whose sends go as scripted; a timeout runs the call's clock out first."""

    def __init__(self, *outcomes: Attempt) -> None:
        self.outcomes = list(outcomes)
        self.keys: list[str] = []

    async def attempt(
        self, tool: UpstreamTool, name: str, args: dict[str, Any], key: str, deadline: float
    ) -> Attempt:
        self.keys.append(key)
        outcome = self.outcomes.pop(0)
        if outcome is TIMED_OUT:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(max(0.0, deadline - loop.time()))
        return outcome


@dataclass
class Side:
    """The run's side: what the machine would hold, sends journaled, answers to questions."""

    answers: list[bool] = field(default_factory=list)
    sent_before: m.Sent | None = None
    sends: list[tuple[bool, bool]] = field(default_factory=list)
    asked: int = 0
    unknowns: list[str] = field(default_factory=list)

    @property
    def handle(self) -> str:
        return "run-1"

    def sent(self, call_id: str) -> m.Sent | None:
        if not self.sends:
            return self.sent_before
        resendable, approval = self.sends[-1]
        attempts = len(self.sends) + (self.sent_before.attempts if self.sent_before else 0)
        return m.Sent(call_id=call_id, attempts=attempts, resendable=resendable, approval=approval)

    async def sending(self, call: m.ToolCall, *, resendable: bool, approval: bool) -> None:
        self.sends.append((resendable, approval))

    async def ask_again(self, call: m.ToolCall) -> bool:
        self.asked += 1
        return self.answers.pop(0)

    def unknown(self, then: str) -> None:
        self.unknowns.append(then)


async def settle(
    script: Script, side: Side, the_call: m.ToolCall, timeout: float = 5.0, **kw: Any
) -> m.ToolResult:
    caller = ToolCaller(cast(Upstreams, script), timeout=timeout)
    return await caller.settle(side, the_call, OFFERED, **kw)


async def test_an_answered_call_is_journaled_once_and_carries_its_key() -> None:
    script, side = Script(answered("charged")), Side()
    result = await settle(script, side, call("charge"))
    assert (result.content, result.ok) == ("charged", True)
    assert side.sends == [(False, False)] and script.keys == ["run-1/c1"]


@pytest.mark.parametrize("name", ["set_status", "lookup"])
async def test_an_unknown_outcome_of_an_idempotent_or_read_only_tool_is_sent_again_same_key(
    name: str,
) -> None:
    script, side = Script(UNKNOWN, answered()), Side()
    result = await settle(script, side, call(name))
    assert result.ok and side.sends == [(True, False), (True, False)]
    assert script.keys == ["run-1/c1"] * 2 and side.unknowns == ["resent"]


async def test_an_unknown_outcome_of_any_other_tool_is_told_to_the_model_not_sent_again() -> None:
    script, side = Script(UNKNOWN), Side()
    result = await settle(script, side, call("charge"))
    assert not result.ok and "may or may not have run (the session broke)" in result.content
    assert side.sends == [(False, False)] and side.unknowns == ["reported"]


async def test_a_tool_that_needs_approval_asks_again_before_it_is_sent_again() -> None:
    script, side = Script(UNKNOWN, answered("charged once more")), Side(answers=[True])
    result = await settle(script, side, call("charge"), approval=True, allowed=True)
    assert result.ok and side.asked == 1 and side.sends == [(False, True), (False, True)]
    declined = Side(answers=[False])
    result = await settle(Script(UNKNOWN), declined, call("charge"), approval=True, allowed=True)
    assert "The user chose not to send it again" in result.content and len(declined.sends) == 1


async def test_a_declined_call_and_one_that_cannot_be_sent_are_never_sent() -> None:
    side = Side()
    declined = await settle(Script(), side, call("charge"), approval=True, allowed=False)
    invented = await settle(Script(), side, call("invented"))
    malformed = await settle(Script(), side, call("charge", '{"n": "many"}'))
    assert declined.content == DECLINED and "no tool named invented" in invented.content
    assert malformed.content.startswith("Error: ") and "n" in malformed.content
    assert side.sends == []


async def test_a_call_that_never_left_within_its_time_says_it_was_not_sent() -> None:
    result = await settle(Script(NOT_SENT), Side(), call("charge"), timeout=2.5)
    assert "could not be reached within 2.5 s (connection refused)" in result.content


async def test_a_call_whose_time_ran_out_is_not_sent_again_even_if_idempotent() -> None:
    side = Side()
    result = await settle(Script(TIMED_OUT), side, call("set_status"), timeout=0.05)
    assert "may or may not have run: no answer within its 0.05 s" in result.content
    assert side.sends == [(True, False)] and side.unknowns == ["spent"]


async def test_after_an_unknown_outcome_a_call_that_never_left_may_still_have_run() -> None:
    result = await settle(Script(UNKNOWN, NOT_SENT), Side(), call("set_status"))
    assert "may or may not have run" in result.content and "the session broke" in result.content


async def test_a_call_journaled_as_sent_before_a_restart_goes_through_the_rule() -> None:
    before = m.Sent(call_id="c1", resendable=True)
    side = Side(sent_before=before)
    result = await settle(Script(answered("again")), side, call("set_status"))
    assert result.content == "again" and side.sends == [(True, False)]
    charged = Side(sent_before=m.Sent(call_id="c1"))
    script = Script()
    told = await settle(script, charged, call("charge"))
    assert "runtime stopped while the call was in flight" in told.content
    assert charged.sends == [] and script.keys == []
