"""Prices, what runs cost and spawn's money check (`price`, `price_table`, `budget`): pure, no
event loop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from luftpause.runtime.core import budget, journal, price_table
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.errors import RequestError
from luftpause.runtime.core.price import Price
from luftpause.runtime.core.price_table import PricesError, parse_prices
from luftpause.runtime.core.turn_samples import Ledger
from luftpause.runtime.plans.planner import load_prices
from tests.runtime.make_golden import GOLDEN

PRICE = Price(input=0.15, cached_input=0.075, output=0.60)
TABLE = parse_prices(
    {
        "prices": {
            "sim": {"input": 0.15, "cached_input": 0.075, "output": 0.60},
            "local": {"context_window": 8192},
        }
    }
)


@dataclass
class R:
    state: m.RunState


def spec(handle: str, parent: str | None = None, **kw: Any) -> m.RunSpec:
    return m.RunSpec(handle=handle, task="t", model="sim", parent=parent, spawned_at=100.0, **kw)


def with_turn(state: m.RunState, prompt: int, cached: int, completion: int) -> m.RunState:
    usage = m.Usage(
        turns=1, prompt_tokens=prompt, cached_prompt_tokens=cached, completion_tokens=completion
    )
    state, _ = m.step(state, m.TurnCompleted(content="done", usage=usage, at=110.0))
    return state


def test_a_turn_costs_its_uncached_cached_and_completion_tokens_at_their_prices() -> None:
    cost = PRICE.cost(prompt=1_000_000, cached=400_000, completion=100_000)
    assert cost == pytest.approx(0.6 * 0.15 + 0.4 * 0.075 + 0.1 * 0.60)


@given(
    prompt=st.integers(0, 10**7),
    cached=st.integers(0, 10**7),
    completion=st.integers(0, 10**6),
)
def test_a_cost_is_never_negative_and_a_cache_hit_never_costs_more(
    prompt: int, cached: int, completion: int
) -> None:
    """Invariant: cost >= 0, and serving prompt tokens from the cache never raises it (the
    cached price is at most the input price here), however many the engine claims were cached."""
    full = PRICE.cost(prompt=prompt, cached=0, completion=completion)
    hit = PRICE.cost(prompt=prompt, cached=cached, completion=completion)
    assert 0 <= hit <= full + 1e-12


def test_the_default_entry_prices_every_model_not_named_and_cached_input_defaults_to_input() -> (
    None
):
    table = parse_prices({"prices": {"default": {"input": 1, "output": 2}}})
    assert table.price("anything") == Price(input=1.0, cached_input=1.0, output=2.0)
    assert TABLE.price("local") is None and TABLE.context_window("local") == 8192
    assert TABLE.price("unknown") is None


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"models": {}}, "'prices' mapping"),
        ({"prices": {}, "extra": 1}, "unknown keys ['extra']"),
        ({"prices": {"m": 3}}, "prices.m must be a mapping"),
        ({"prices": {"m": {"input": 1}}}, "a price needs output too"),
        ({"prices": {"m": {"input": -1, "output": 1}}}, "prices.m.input must be a number >= 0"),
        ({"prices": {"m": {"input": "0.1", "output": 1}}}, "prices.m.input must be a number"),
        ({"prices": {"m": {"input": True, "output": 1}}}, "prices.m.input must be a number"),
        ({"prices": {"m": {"input": 1, "output": 1, "tax": 2}}}, "unknown keys ['tax']"),
        ({"prices": {"m": {"context_window": 0}}}, "context_window must be at least 1"),
        ({"prices": {"m": {"context_window": 1.5}}}, "context_window must be a whole number"),
        ({"prices": {"m": {}}}, "neither a price nor a context_window"),
    ],
)
def test_a_malformed_prices_file_is_refused_saying_where_and_what(raw: Any, says: str) -> None:
    with pytest.raises(PricesError, match=None) as caught:
        parse_prices(raw)
    assert says in str(caught.value)


def test_prices_load_from_yaml_and_toml_and_name_the_file_when_wrong(tmp_path: Path) -> None:
    yml = tmp_path / "prices.yaml"
    yml.write_text("prices:\n  sim: {input: 0.15, cached_input: 0.075, output: 0.60}\n")
    toml = tmp_path / "prices.toml"
    toml.write_text('[prices."gpt-4.1-mini"]\ninput = 0.4\noutput = 1.6\n')
    assert load_prices(yml).price("sim") == PRICE
    assert load_prices(toml).price("gpt-4.1-mini") == Price(input=0.4, cached_input=0.4, output=1.6)
    bad = tmp_path / "bad.yaml"
    bad.write_text("prices:\n  sim: {input: -1, output: 1}\n")
    with pytest.raises(PricesError, match=r"bad\.yaml: prices\.sim\.input"):
        load_prices(bad)
    with pytest.raises(PricesError, match="cannot read"):
        load_prices(tmp_path / "missing.yaml")


def test_spawn_freezes_the_models_price_into_the_spec_and_the_journal() -> None:
    priced = price_table.priced(spec("a"), {}, TABLE)
    assert priced.price == PRICE
    assert m.RunSpec.from_json(priced.to_json()) == priced
    assert "price" not in spec("b").to_json() and "budgetUsd" not in spec("b").to_json()


def test_a_usd_budget_on_a_model_without_a_price_is_refused_at_spawn() -> None:
    with pytest.raises(RequestError, match="budgetUsd needs a price for model 'local'"):
        price_table.priced(
            m.RunSpec(handle="a", task="t", model="local", budget_usd=1.0), {}, TABLE
        )
    with pytest.raises(RequestError, match="budgetUsd needs a price"):
        price_table.priced(spec("a", budget_usd=1.0), {}, None)


def test_a_child_without_a_price_under_a_usd_budget_is_refused_and_one_outside_is_not() -> None:
    runs = {"p": R(m.start(price_table.priced(spec("p", budget_usd=1.0), {}, TABLE)))}
    child = m.RunSpec(handle="c", task="t", model="local", parent="p")
    with pytest.raises(RequestError, match="run p has a USD budget"):
        price_table.priced(child, runs, TABLE)
    assert (
        price_table.priced(m.RunSpec(handle="d", task="t", model="local"), runs, TABLE).price
        is None
    )


def test_a_usd_budget_trips_once_the_subtree_cost_passes_it() -> None:
    parent = m.start(price_table.priced(spec("p", budget_usd=0.0001), {}, TABLE))
    child = with_turn(m.start(price_table.priced(spec("c", "p"), {}, TABLE)), 500, 0, 100)
    runs = {"p": R(parent), "c": R(child)}
    assert budget.used(runs, "p", now=120.0)["usd"] == pytest.approx(0.000135)
    [(handle, exceeded)] = budget.check(runs, "c", now=120.0)
    assert handle == "p" and exceeded.which == "usd"
    assert exceeded.reason == "budget exceeded: usd 0.000135/0.0001"


def test_spend_shows_own_and_subtree_cost_and_never_a_silent_zero() -> None:
    priced = with_turn(m.start(price_table.priced(spec("p"), {}, TABLE)), 1000, 500, 100)
    unpriced = with_turn(m.start(spec("c", "p")), 10, 0, 10)
    runs = {"p": R(priced), "c": R(unpriced)}
    out = price_table.spend(runs, "p", now=120.0)
    assert out == {
        "tokens": 1100,
        "usd": pytest.approx(0.0001725),
        "seconds": 10.0,
        "subtreeTokens": 1120,
        "subtreeUsd": pytest.approx(0.0001725),
        "unpricedRuns": 1,
    }
    assert price_table.spend(runs, "c", now=120.0)["usd"] is None
    assert "usd" not in budget.used(runs, "p", now=120.0)  # a sum with a run unpriced: unknown


def test_a_predicted_seconds_trip_says_so_and_survives_the_journal() -> None:
    exceeded = m.Exceeded(which="seconds", used=9.1, limit=12.0, predicted=3.25)
    assert exceeded.reason == "budget exceeded: seconds (predicted) 9.1+3.2/12"
    assert exceeded.to_json()["predicted"] == 3.25
    assert "predicted" not in m.Exceeded(which="seconds", used=13.0, limit=12.0).to_json()
    with pytest.raises(ValueError, match="only a seconds budget"):
        m.Exceeded(which="tokens", used=1, limit=1, predicted=1.0)


def test_a_golden_journal_replays_prices_budgets_and_both_kinds_of_seconds_trip() -> None:
    """The journal keeps a run's price and budgetUsd and a predicted trip: replay gives the
    reasons it journaled, and what the runs cost, without the prices file."""
    decoder = journal.JournalDecoder()
    records = decoder.feed((GOLDEN / "usd_and_predicted_trips.jsonl").read_bytes())
    replayed = journal.replay(records)
    a, b = replayed.runs["run-a"], replayed.runs["run-b"]
    assert (a.spec.price, a.spec.budget_usd) == (PRICE, 0.00005)
    assert a.exceeded is not None and a.exceeded.reason == a.error
    assert b.exceeded is not None and b.exceeded.predicted == 4.0 and b.exceeded.reason == b.error
    runs = {h: R(s) for h, s in replayed.runs.items()}
    assert price_table.spend(runs, "run-a", now=2000.0)["usd"] == 7.95e-05
    ledger = Ledger()
    spent = [s.usd for r in records for s in ledger.feed(r)]
    assert spent == [pytest.approx(7.95e-05)] and ledger.stats("sim").first_seconds.n == 2
