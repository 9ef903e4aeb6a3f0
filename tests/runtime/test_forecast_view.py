"""A live run as the forecast sees it (`forecast_view`), and the seconds budget that looks one
turn ahead (`lookahead`): pure, no event loop. One file, since both read a run's state and a
ledger built the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from luftpause.runtime.core import forecast_view, lookahead
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.forecast import project
from luftpause.runtime.core.price import Price
from luftpause.runtime.core.turn_samples import Ledger

PRICE = Price(input=1.0, cached_input=0.5, output=2.0)
USAGE = {"turns": 1, "promptTokens": 100, "completionTokens": 10, "turnSeconds": 0.5}


@dataclass
class R:
    state: m.RunState


def spec(handle: str, parent: str | None = None, **kw: Any) -> m.RunSpec:
    kw.setdefault("max_tool_calls", 3)
    return m.RunSpec(handle=handle, task="t" * 400, model="sim", parent=parent, **kw)


def taught(seconds: float, answer_seconds: float | None = None) -> Ledger:
    """A ledger that saw one finished run of `sim` whose turns took `seconds` each."""
    ledger = Ledger()
    usage = {"turns": 1, "promptTokens": 100, "completionTokens": 10, "turnSeconds": seconds}
    answer = dict(usage, turnSeconds=seconds if answer_seconds is None else answer_seconds)
    for record in (
        {"type": "spawned", "run": "old", "spec": {"model": "sim"}},
        {"type": "round", "run": "old", "results": [{"seconds": 0.1}], "usage": usage},
        {"type": "finished", "run": "old", "state": "finished", "usage": answer},
    ):
        ledger.feed(record)
    return ledger


def call_turn(state: m.RunState, prompt: int = 100) -> m.RunState:
    call = m.ToolCall(id=f"c{state.rounds}", name="lookup", arguments="{}")
    usage = m.Usage(turns=1, prompt_tokens=prompt, completion_tokens=10, turn_seconds=1.0)
    state, _ = m.step(state, m.TurnCompleted(content=None, tool_calls=(call,), usage=usage))
    return state


def with_round(state: m.RunState) -> m.RunState:
    state = call_turn(state)
    result = m.ToolResult(call_id=state.pending[0].id, name="lookup", content="x" * 80)
    state, _ = m.step(state, m.ToolsReturned(results=(result,)))
    return state


def test_a_turn_that_would_overrun_the_seconds_left_trips_the_budget_before_it() -> None:
    runs = {"p": R(m.start(spec("p", budget_seconds=10.0, spawned_at=100.0)))}
    found = lookahead.overrun(runs, "p", taught(4.0), now=107.0)
    assert found is not None
    handle, exceeded = found
    assert handle == "p" and (exceeded.which, exceeded.used, exceeded.predicted) == (
        "seconds",
        7.0,
        4.0,
    )
    assert exceeded.reason == "budget exceeded: seconds (predicted) 7+4/10"
    assert lookahead.overrun(runs, "p", taught(4.0), now=105.0) is None  # 5 s left: it fits


def test_an_ancestors_seconds_budget_looks_ahead_for_every_run_below_it() -> None:
    runs = {
        "p": R(m.start(spec("p", budget_seconds=10.0, spawned_at=100.0))),
        "c": R(m.start(spec("c", "p", spawned_at=105.0))),
    }
    found = lookahead.overrun(runs, "c", taught(4.0), now=107.0)
    assert found is not None and found[0] == "p"


def test_the_answer_turn_is_predicted_from_answers_and_a_first_turn_from_first_turns() -> None:
    state = with_round(m.start(spec("p", budget_seconds=10.0, spawned_at=100.0, max_tool_calls=1)))
    runs = {"p": R(state)}
    for answer_seconds, trips in ((6.0, True), (4.0, False)):
        ledger = taught(0.5, answer_seconds=answer_seconds)
        ledger.feed({"type": "spawned", "run": "p", "spec": {"model": "sim"}})
        ledger.feed({"type": "round", "run": "p", "results": [], "usage": USAGE})
        assert (lookahead.overrun(runs, "p", ledger, now=105.0) is not None) is trips
    fresh = {"q": R(m.start(spec("q", budget_seconds=10.0, spawned_at=100.0)))}
    assert lookahead.overrun(fresh, "q", taught(6.0, answer_seconds=0.1), now=105.0) is not None


def test_nothing_is_predicted_without_a_seen_turn_a_budget_or_a_turn_to_take() -> None:
    runs = {"p": R(m.start(spec("p", budget_seconds=1.0, spawned_at=100.0)))}
    assert lookahead.overrun(runs, "p", Ledger(), now=100.9) is None
    runs = {"p": R(m.start(spec("p", spawned_at=100.0)))}
    assert lookahead.overrun(runs, "p", taught(60.0), now=200.0) is None
    tools = call_turn(m.start(spec("p", budget_seconds=10.0, spawned_at=100.0)))
    assert lookahead.overrun({"p": R(tools)}, "p", taught(60.0), now=101.0) is None


def test_a_run_in_its_tool_round_counts_its_turn_and_not_its_running_calls() -> None:
    state = call_turn(with_round(m.start(spec("p", price=PRICE, budget_tokens=10_000))), 150)
    runs = {"p": R(state)}
    given = forecast_view.inputs(runs, "p", taught(1.0), now=0.0)
    assert given.in_round and given.calls_left == 1  # 3 - 1 made - 1 running
    assert [t.prompt for t in given.history.turns][-1] == 150
    assert given.price == PRICE and [b.run for b in given.budgets] == ["p"]
    assert given.prompt_guess == 400 // 4 + 80 // 4


def test_the_tools_answer_shows_the_runs_use_now_and_the_forecast() -> None:
    runs = {"p": R(with_round(m.start(spec("p", price=PRICE, spawned_at=100.0))))}
    ledger = taught(1.0)
    out = forecast_view.view(
        runs, "p", 103.0, project(forecast_view.inputs(runs, "p", ledger, 103.0))
    )
    assert out["now"] == {"tokens": 110, "usd": 0.00012, "seconds": 3.0, "turns": 1, "toolCalls": 1}
    assert out["horizon"] == {"steps": 3, "toolCalls": 2.0, "until": "answer"}
    assert out["tokens"]["total"] > 0 and out["usd"]["expected"] > 0
    assert out["seconds"]["total"] > 0 and out["first"] is None
    over, _ = m.step(runs["p"].state, m.Cancel(at=104.0))
    done = forecast_view.view({"p": R(over)}, "p", 200.0, None)
    assert done["horizon"]["until"] == "over" and done["now"]["seconds"] == 4.0
