"""Budgets over a subtree: pure, no event loop."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from luftpause.runtime.core import budget
from luftpause.runtime.core import machine as m


@dataclass
class R:
    state: m.RunState


def spec(handle: str, parent: str | None = None, **kw: object) -> m.RunSpec:
    return m.RunSpec(handle=handle, task="t", model="sim", parent=parent, spawned_at=100.0, **kw)  # type: ignore[arg-type]


def with_round(state: m.RunState, calls: int, tokens: int = 10) -> m.RunState:
    tc = tuple(m.ToolCall(id=f"c{i}", name="lookup", arguments="{}") for i in range(calls))
    usage = m.Usage(turns=1, prompt_tokens=tokens, completion_tokens=0)
    state, _ = m.step(state, m.TurnCompleted(content=None, tool_calls=tc, usage=usage))
    results = tuple(m.ToolResult(call_id=c.id, name=c.name, content="r") for c in tc)
    state, _ = m.step(state, m.ToolsReturned(results=results))
    return state


def tree(*states: m.RunState) -> dict[str, R]:
    return {s.spec.handle: R(s) for s in states}


def par(**kw: object) -> m.RunSpec:
    return spec("p", parallel_tool_calls=True, **kw)  # type: ignore[arg-type]


def test_a_subtree_counts_every_run_below_the_budgeted_one_later_children_included() -> None:
    parent = m.start(par(budget_tool_calls=2))
    child = with_round(m.start(spec("c1", "p", parallel_tool_calls=True)), 2)
    grandchild = with_round(m.start(spec("g", "c1")), 1)
    runs = tree(parent, child, grandchild)
    assert budget.used(runs, "p", now=101.0)["toolCalls"] == 3
    [(handle, exceeded)] = budget.check(runs, "g", now=101.0)
    assert handle == "p" and exceeded.reason == "budget exceeded: toolCalls 3/2"


def test_a_limit_is_past_only_when_the_use_is_greater_than_it() -> None:
    runs = tree(m.start(par(budget_tool_calls=2)), with_round(m.start(spec("c", "p")), 1))
    runs["c"] = R(with_round(runs["c"].state, 1))
    assert budget.check(runs, "c", now=101.0) == []


def test_tokens_count_a_turn_whose_tool_calls_are_still_running() -> None:
    state = m.start(spec("p", budget_tokens=50))
    call = m.ToolCall(id="c", name="lookup", arguments="{}")
    usage = m.Usage(turns=1, prompt_tokens=40, completion_tokens=20)
    state, _ = m.step(state, m.TurnCompleted(content=None, tool_calls=(call,), usage=usage))
    [(_, exceeded)] = budget.check(tree(state), "p", now=100.0)
    assert (exceeded.which, exceeded.used, exceeded.limit) == ("tokens", 60, 50)


def test_seconds_run_on_while_the_subtree_lives_and_stop_when_it_is_all_over() -> None:
    parent = m.start(spec("p", budget_seconds=10))
    child = m.start(spec("c", "p"))
    assert budget.check(tree(parent, child), "p", now=109.0) == []
    [(_, exceeded)] = budget.check(tree(parent, child), "p", now=110.5)
    assert exceeded.reason == "budget exceeded: seconds 10.5/10"
    done_p, _ = m.step(parent, m.TurnCompleted(content="x", at=103.0))
    done_c, _ = m.step(child, m.Cancel(at=105.0))
    assert budget.used(tree(done_p, done_c), "p", now=500.0)["seconds"] == 5.0
    assert budget.check(tree(done_p, done_c), "p", now=500.0) == []


def test_an_exceeded_budget_is_marked_once_even_on_a_run_that_is_over_and_blocks_below() -> None:
    done, _ = m.step(m.start(spec("p", budget_tokens=1)), m.TurnCompleted(content="x"))
    exceeded = m.Exceeded(which="tokens", used=5, limit=1)
    marked, ds = m.step(done, m.BudgetExceeded(exceeded=exceeded))
    assert marked.exceeded == exceeded and ds == (m.RecordExceeded(exceeded=exceeded),)
    assert m.step(marked, m.BudgetExceeded(exceeded=exceeded)) == (marked, ())
    runs = tree(marked, m.start(spec("c", "p")))
    assert budget.blocking(runs, "c") == exceeded
    assert budget.check(runs, "c", now=1000.0) == []  # already tripped: not again


def test_status_shows_limits_used_and_exceeded_only_for_budgeted_runs() -> None:
    runs = tree(m.start(spec("p", budget_tool_calls=4, budget_seconds=60)), m.start(spec("c", "p")))
    view = budget.view(runs, "p", now=112.0)
    assert view == {
        "limits": {"toolCalls": 4, "seconds": 60},
        "used": {"tokens": 0, "toolCalls": 0, "seconds": 12.0},
        "exceeded": None,
    }
    assert budget.view(runs, "c", now=112.0) is None


def test_a_budget_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="budgetToolCalls"):
        spec("p", budget_tool_calls=-1)
