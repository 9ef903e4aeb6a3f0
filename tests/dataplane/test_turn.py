"""A turn's bookkeeping: events in order, exactly one end, the run table kept current."""

from __future__ import annotations

import pytest

from luftpause.dataplane.identity import ServiceClass, ToolCallMemory
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.reply import ReplySummary, Usage
from luftpause.dataplane.runs import Phase, RunTable
from luftpause.dataplane.turn import Turn
from luftpause.rpc import scheduler_pb2 as pb


class Recorder:
    def __init__(self) -> None:
        self.events: list[pb.TurnEvent] = []
        self.runs = RunTable()
        self.memory = ToolCallMemory()

    def kinds(self) -> list[str]:
        return [e.WhichOneof("kind") or "" for e in self.events]

    def turn(self) -> Turn:
        return Turn(
            turn_id="t1",
            run_id="r1",
            model="m",
            service_class=ServiceClass.INTERACTIVE,
            caller="c",
            request_bytes=10,
            report=lambda event, _replica: self.events.append(event),
            runs=self.runs,
            memory=self.memory,
            metrics=Metrics(),
            clock=lambda: 100.0,
        )


def test_finished_turn_reports_in_order_and_remembers_its_tool_calls() -> None:
    rec = Recorder()
    turn = rec.turn()
    turn.placed("engine-a")
    assert rec.runs.phase("r1") is Phase.GENERATING
    turn.started()
    turn.first_token()
    turn.first_token()
    summary = ReplySummary(
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=1),
        tool_call_ids=("call_1",),
        tool_calls=True,
    )
    turn.finished(summary)
    turn.close("client disconnected")
    assert rec.kinds() == ["started", "first_token", "finished"]
    assert rec.events[-1].finished.usage.prompt_tokens == 1
    assert rec.runs.phase("r1") is Phase.TOOL_PAUSED
    assert rec.memory.recognise(["call_1"], now=100.0) == "r1"


def test_closing_a_held_turn_reports_it_abandoned() -> None:
    rec = Recorder()
    rec.turn().close("client disconnected")
    assert rec.kinds() == ["abandoned"]
    assert rec.runs.runs == {}


def test_closing_a_placed_turn_reports_it_failed_and_frees_the_run() -> None:
    rec = Recorder()
    turn = rec.turn()
    turn.placed("engine-a")
    turn.close("client disconnected")
    assert rec.kinds() == ["failed"]
    assert rec.events[0].failed.reason == "client disconnected"
    assert rec.runs.phase("r1") is Phase.IDLE and rec.runs.turns == {}


def test_rejected_turn_reports_nothing() -> None:
    rec = Recorder()
    turn = rec.turn()
    turn.rejected()
    turn.close("client disconnected")
    assert rec.events == []


def test_turn_cannot_start_before_it_is_placed() -> None:
    with pytest.raises(RuntimeError):
        Recorder().turn().started()
