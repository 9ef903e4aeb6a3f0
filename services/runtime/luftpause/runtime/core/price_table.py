"""Prices per model, what runs cost, and the money side of spawn.

Pure module: no I/O (`planner.load_prices` reads the file). The runtime's prices file (`--prices`,
YAML, or TOML by extension) gives, per model, USD per million input, cached input and output
tokens, and optionally the model's context window in tokens (for `forecast`):

    prices:
      gpt-4.1-mini: {input: 0.40, cached_input: 0.10, output: 1.60, context_window: 1047576}
      luftpause-sim: {context_window: 32768}     # no price: its runs cost nothing known
      default: {input: 0.15, cached_input: 0.075, output: 0.60}

`default` stands for every model not named. `cached_input` defaults to `input` (no discount for
prompt tokens served from the engine's cache). A run gets its model's price at spawn, frozen into
its spec (`values.RunSpec.price`), so it costs the same after a restart whatever the file says
then. A run under a USD budget (its own `budgetUsd` or an ancestor's) must have a price: spawn
refuses it otherwise, never counting its turns as free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from luftpause.runtime.core import budget
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.budget import HasState
from luftpause.runtime.core.errors import RequestError
from luftpause.runtime.core.price import Price, usd

DEFAULT = "default"
_PRICE_KEYS = ("input", "cached_input", "output")
_KEYS = frozenset((*_PRICE_KEYS, "context_window"))


class PricesError(ValueError):
    """The prices file cannot be read or is malformed (the message says where and how)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One model's line of the file: its price and its context window, either optional."""

    price: Price | None = None
    context_window: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceTable:
    """The prices file: entries by model name, `default` for the rest."""

    entries: Mapping[str, Entry] = field(default_factory=dict)

    def entry(self, model: str) -> Entry | None:
        return self.entries.get(model, self.entries.get(DEFAULT))

    def price(self, model: str) -> Price | None:
        entry = self.entry(model)
        return None if entry is None else entry.price

    def context_window(self, model: str) -> int | None:
        entry = self.entry(model)
        return None if entry is None else entry.context_window


# --- the file ---


def parse_prices(raw: Any) -> PriceTable:
    """A price table from the file's parsed content; `PricesError` saying what is wrong."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("prices"), Mapping):
        raise PricesError("the prices file must be a mapping with a 'prices' mapping")
    unknown = set(raw) - {"prices"}
    if unknown:
        raise PricesError(f"unknown keys {sorted(unknown)} (only 'prices')")
    entries = {}
    for model, value in raw["prices"].items():
        if not isinstance(model, str) or not model:
            raise PricesError(f"prices: model names must be non-empty strings, got {model!r}")
        entries[model] = _entry(value, f"prices.{model}")
    return PriceTable(entries=entries)


def _entry(value: Any, where: str) -> Entry:
    if not isinstance(value, Mapping):
        raise PricesError(f"{where} must be a mapping (input, cached_input, output, ...)")
    unknown = set(value) - _KEYS
    if unknown:
        raise PricesError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(_KEYS)})")
    given = {k: _usd(value[k], f"{where}.{k}") for k in _PRICE_KEYS if k in value}
    price = None
    if given:
        missing = [k for k in ("input", "output") if k not in given]
        if missing:
            raise PricesError(f"{where}: a price needs {' and '.join(missing)} too")
        cached = given.get("cached_input", given["input"])
        price = Price(input=given["input"], cached_input=cached, output=given["output"])
    window = value.get("context_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)):
        raise PricesError(f"{where}.context_window must be a whole number of tokens")
    if window is not None and window < 1:
        raise PricesError(f"{where}.context_window must be at least 1")
    if price is None and window is None:
        raise PricesError(f"{where} gives neither a price nor a context_window")
    return Entry(price=price, context_window=window)


def _usd(value: Any, where: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise PricesError(f"{where} must be a number >= 0 (USD per million tokens), got {value!r}")
    return float(value)


# --- spawn ---


def priced(spec: m.RunSpec, runs: Mapping[str, HasState], table: PriceTable | None) -> m.RunSpec:
    """`spec` with its model's price; `RequestError` when a USD budget covers it and the model
    has none."""
    price = None if table is None else table.price(spec.model)
    if price is not None:
        return replace(spec, price=price)
    if spec.budget_usd is not None:
        raise RequestError(
            f"budgetUsd needs a price for model {spec.model!r}, and the runtime's prices "
            f"(--prices) have none"
        )
    above = [] if spec.parent is None else budget.ancestors(runs, spec.parent)
    covering = next((h for h in above if runs[h].state.spec.budget_usd is not None), None)
    if covering is not None:
        raise RequestError(
            f"run {covering} has a USD budget, and the runtime's prices (--prices) have none "
            f"for model {spec.model!r}: its cost could not be counted"
        )
    return spec


# --- what runs cost ---


def tokens(state: m.RunState) -> int:
    """Prompt plus completion tokens of a run, a turn whose tools are still running included."""
    u, p = state.usage, state.pending_usage
    return u.prompt_tokens + u.completion_tokens + p.prompt_tokens + p.completion_tokens


def spend(runs: Mapping[str, HasState], handle: str, now: float) -> dict[str, Any]:
    """What status and await show as a run's `spend`: its own tokens, USD and seconds, and its
    subtree's tokens and USD. USD is None where unknown (no price), never 0; a subtree with runs
    both priced and not says how many lack a price."""
    state = runs[handle].state
    states = [runs[h].state for h in budget.subtree(handle, budget.children(runs))]
    own = budget.cost(state)
    costs = [c for s in states if (c := budget.cost(s)) is not None]
    out: dict[str, Any] = {
        "tokens": tokens(state),
        "usd": None if own is None else usd(own),
        "seconds": round(max(0.0, (state.ended_at or now) - state.spec.spawned_at), 3),
        "subtreeTokens": sum(tokens(s) for s in states),
        "subtreeUsd": usd(sum(costs)) if costs else None,
    }
    if costs and len(costs) < len(states):
        out["unpricedRuns"] = len(states) - len(costs)
    return out
