"""The ledger (`turn_samples`): journal records in, run histories and model statistics out."""

from __future__ import annotations

from typing import Any

import pytest

from luftpause.runtime.core.turn_samples import Ledger, Spread, TurnSample

PRICE = {"input": 1.0, "cachedInput": 0.5, "output": 2.0}


def spawned(run: str, model: str = "sim", price: dict[str, float] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"handle": run, "task": "t", "model": model}
    if price is not None:
        spec["price"] = price
    return {"v": 1, "type": "spawned", "run": run, "spec": spec}


def usage(prompt: int, completion: int, seconds: float, cached: int = 0) -> dict[str, Any]:
    return {
        "turns": 1,
        "promptTokens": prompt,
        "cachedPromptTokens": cached,
        "completionTokens": completion,
        "turnSeconds": seconds,
    }


def round_(run: str, n: int, prompt: int, tool_seconds: tuple[float, ...] = (0.5,)) -> dict:
    results = [
        {"id": f"c{i}", "name": "lookup", "content": "r", "ok": True, "seconds": s}
        for i, s in enumerate(tool_seconds)
    ]
    return {
        "v": 1,
        "type": "round",
        "run": run,
        "round": n,
        "assistant": {},
        "results": results,
        "usage": usage(prompt, 10, 1.0, cached=prompt // 2),
    }


def finished(run: str, prompt: int, state: str = "finished") -> dict[str, Any]:
    u = usage(prompt, 60, 3.0) if state == "finished" else {"turns": 0}
    return {"v": 1, "type": "finished", "run": run, "state": state, "usage": u, "at": 1.0}


def test_a_runs_rounds_make_its_history_and_its_answer_ends_it() -> None:
    ledger = Ledger()
    for r in (spawned("a"), round_("a", 1, 100, (0.2, 0.7)), round_("a", 2, 150)):
        ledger.feed(r)
    history = ledger.history("a")
    assert [t.prompt for t in history.turns] == [100, 150]
    assert [(r.calls, r.seconds) for r in history.rounds] == [(2, 0.7), (1, 0.5)]
    ledger.feed(finished("a", 200))
    assert ledger.history("a").turns == ()  # over: its history goes, its lessons stay
    stats = ledger.stats("sim")
    assert stats.first_prompt == Spread(n=1, mean=100.0, sd=0.0)
    assert stats.growth.n == 2 and stats.growth.mean == 50.0
    assert stats.call_completion.mean == 10.0 and stats.answer_completion.mean == 60.0
    assert stats.answer_seconds.mean == 3.0 and stats.turns == 3
    assert stats.cache_ratio == Spread.of([0.5, 0.0])  # turns after the first


def test_models_are_learned_apart_and_an_unknown_model_knows_nothing() -> None:
    ledger = Ledger()
    for r in (spawned("a", "one"), round_("a", 1, 100), spawned("b", "two"), round_("b", 1, 900)):
        ledger.feed(r)
    assert ledger.stats("one").first_prompt.mean == 100.0
    assert ledger.stats("two").first_prompt.mean == 900.0
    assert ledger.stats("three").turns == 0


def test_a_priced_runs_turns_are_spent_and_an_unpriced_runs_are_not() -> None:
    ledger = Ledger()
    assert ledger.feed(spawned("a", price=PRICE)) == []
    [spent] = ledger.feed(round_("a", 1, 1_000_000))
    assert (spent.model, spent.usd) == ("sim", pytest.approx(0.5 + 0.25 + 10 * 2.0 / 1e6))
    ledger.feed(spawned("b"))
    assert ledger.feed(round_("b", 1, 100)) == []


def test_a_compaction_is_spent_and_the_next_turn_teaches_no_growth() -> None:
    ledger = Ledger()
    ledger.feed(spawned("a", price=PRICE))
    ledger.feed(round_("a", 1, 1000))
    compacted = {"v": 1, "type": "compacted", "run": "a", "usage": usage(1000, 100, 2.0)}
    [spent] = ledger.feed(compacted)
    assert spent.usd == pytest.approx(1000 / 1e6 + 100 * 2 / 1e6)
    ledger.feed(round_("a", 2, 300))
    assert ledger.stats("sim").growth.n == 0
    assert ledger.history("a").turns[-1] == TurnSample(
        prompt=300, cached=150, completion=10, seconds=1.0, fresh=True
    )


def test_batches_are_read_inside_forks_begin_runs_and_other_records_are_ignored() -> None:
    ledger = Ledger()
    batch = {"v": 1, "type": "batch", "run": "f", "records": [spawned("f"), round_("f", 1, 70)]}
    ledger.feed(batch)
    ledger.feed({"v": 1, "type": "forked", "run": "g", "spec": {"model": "sim"}})
    ledger.feed(round_("g", 1, 80))
    ledger.feed({"v": 1, "type": "approval", "run": "g", "call": "c0", "allow": True})
    ledger.feed(round_("nobody", 1, 5))
    assert [t.prompt for t in ledger.history("f").turns] == [70]
    assert [t.prompt for t in ledger.history("g").turns] == [80]
    assert ledger.stats("sim").first_prompt.n == 2


def test_a_failed_or_cancelled_run_teaches_no_answer() -> None:
    ledger = Ledger()
    ledger.feed(spawned("a"))
    ledger.feed(round_("a", 1, 100))
    ledger.feed(finished("a", 0, state="cancelled"))
    assert ledger.stats("sim").answer_completion.n == 0 and ledger.history("a").turns == ()


def test_a_model_keeps_only_its_recent_samples() -> None:
    ledger = Ledger(window=4)
    for i in range(10):
        ledger.feed(spawned(f"r{i}"))
        ledger.feed(round_(f"r{i}", 1, 100 * i))
    assert ledger.stats("sim").first_prompt == Spread.of([600, 700, 800, 900])


def test_statistics_are_computed_once_until_a_new_sample_of_their_model_arrives() -> None:
    ledger = Ledger()
    for r in (spawned("a", "one"), round_("a", 1, 100), spawned("b", "two"), round_("b", 1, 900)):
        ledger.feed(r)
    first = ledger.stats("one")
    assert ledger.stats("one") is first  # nothing new: the same statistics
    ledger.feed(round_("b", 2, 1000))  # another model's sample
    assert ledger.stats("one") is first
    ledger.feed(round_("a", 2, 160))
    again = ledger.stats("one")
    assert again is not first and again.growth == Spread(n=1, mean=60.0, sd=0.0)
    assert ledger.stats("two").growth.mean == 100.0
