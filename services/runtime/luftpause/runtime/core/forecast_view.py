"""The forecast's way in and out: a live run as `forecast.project` needs to know it
(`inputs`), and the projection as the `forecast` tool shows it (`view`, `render`).

Pure module: no I/O, no clock (`now` is an argument); reads run states through any mapping whose
values have a `.state` (`budget.HasState`) and what the journal taught (`turn_samples.Ledger`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from luftpause.runtime.core import budget, price_table
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.budget import HasState
from luftpause.runtime.core.forecast import (
    CHARS_PER_TOKEN,
    BudgetLine,
    Forecast,
    Hit,
    Inputs,
    Step,
)
from luftpause.runtime.core.price import usd
from luftpause.runtime.core.rate_waits import Window
from luftpause.runtime.core.turn_samples import History, Ledger, TurnSample

STEPS_SHOWN = 50
_IN_ROUND = (m.Phase.TOOLS, m.Phase.AWAITING_APPROVAL)


def inputs(
    runs: Mapping[str, HasState],
    handle: str,
    ledger: Ledger,
    now: float,
    *,
    steps: int | None = None,
    context_window: int | None = None,
    windows: Sequence[Window] = (),
) -> Inputs:
    """What `forecast.project` needs to know of a live run."""
    state = runs[handle].state
    history = ledger.history(handle)
    in_round = state.phase in _IN_ROUND
    if in_round and state.pending_usage.turns:
        u = state.pending_usage
        pending = TurnSample(
            prompt=u.prompt_tokens,
            cached=u.cached_prompt_tokens,
            completion=u.completion_tokens,
            seconds=u.turn_seconds,
        )
        history = History(turns=(*history.turns, pending), rounds=history.rounds)
    lines = []
    for h in budget.ancestors(runs, handle):
        limits = budget.limits(runs[h].state.spec)
        if limits:
            lines.append(BudgetLine(run=h, limits=limits, used=budget.used(runs, h, now)))
    return Inputs(
        history=history,
        prior=ledger.stats(state.spec.model),
        max_tokens=state.spec.max_tokens,
        calls_left=max(0, state.tools_left - (len(state.pending) if in_round else 0)),
        parallel=state.spec.parallel_tool_calls,
        in_round=in_round,
        steps=steps,
        price=state.spec.price,
        context_window=context_window,
        budgets=tuple(lines),
        windows=tuple(windows),
        prompt_guess=_chars(state.messages) // CHARS_PER_TOKEN,
        results_tokens=_chars(_last_results(state.messages)) // CHARS_PER_TOKEN,
    )


def _chars(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(len(str(msg.get("content") or "")) for msg in messages)


def _last_results(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for msg in reversed(messages):
        if msg.get("role") != "tool":
            break
        out.append(msg)
    return out


def now_view(runs: Mapping[str, HasState], handle: str, now: float) -> dict[str, Any]:
    """A run's own use so far, which a forecast adds to."""
    state = runs[handle].state
    cost = budget.cost(state)
    return {
        "tokens": price_table.tokens(state),
        "usd": None if cost is None else usd(cost),
        "seconds": round(max(0.0, (state.ended_at or now) - state.spec.spawned_at), 3),
        "turns": state.usage.turns + state.pending_usage.turns,
        "toolCalls": state.tool_calls,
    }


def view(
    runs: Mapping[str, HasState],
    handle: str,
    now: float,
    forecast: Forecast | None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The `forecast` tool's answer (None `forecast`: the run is over, nothing is left)."""
    state = runs[handle].state
    out: dict[str, Any] = {
        "handle": handle,
        "model": state.spec.model,
        "state": state.phase.value,
        "now": now_view(runs, handle, now),
    }
    if forecast is None:
        return out | {"horizon": {"steps": 0, "toolCalls": 0, "until": "over"}, "notes": []}
    out |= render(forecast)
    if state.phase is m.Phase.AWAITING_APPROVAL:
        out["notes"].append("it waits for the user's approval: that wait is not counted")
    out["notes"] += list(notes)
    return out


def render(f: Forecast) -> dict[str, Any]:
    """The forecast's totals, spreads, limits met and first steps, as JSON."""
    s = f.steps
    prompt, cached = sum(x.prompt for x in s), sum(x.cached for x in s)
    completion = sum(x.completion for x in s)
    total = prompt + completion
    out: dict[str, Any] = {
        "horizon": {"steps": len(s), "toolCalls": _r(sum(x.calls for x in s)), "until": f.until},
        "tokens": {
            "prompt": round(prompt),
            "cachedPrompt": round(cached),
            "completion": round(completion),
            "total": round(total),
            **_range(total, f.tokens_sd, 0),
        },
        "usd": None,
        "seconds": None,
        "context": {
            "window": f.context_window,
            "peak": round(f.context_peak),
            "atStep": next((h.at_step for h in f.hits if h.which == "context"), None),
        },
        "hits": [_hit(h) for h in sorted(f.hits, key=lambda h: h.at_step)],
        "first": None if f.first is None else _hit(f.first),
        "steps": [_step(x) for x in s[:STEPS_SHOWN]],
        "sources": dict(f.sources),
        "notes": list(f.notes),
    }
    costs = [x.usd for x in s]
    if s and all(c is not None for c in costs):
        spent = sum(c or 0.0 for c in costs)
        sd = spent * f.tokens_sd / total if total else 0.0
        low, high = usd(max(spent - sd, 0.0)), usd(spent + sd)
        out["usd"] = {"expected": usd(spent), "low": low, "high": high}
    if f.seconds_sd is not None:
        turns, tools = sum(x.turn_seconds for x in s), sum(x.tool_seconds for x in s)
        waits = sum(x.wait_seconds for x in s)
        out["seconds"] = {
            "turns": _r(turns),
            "tools": _r(tools),
            "waits": _r(waits),
            "total": _r(turns + tools + waits),
            **_range(turns + tools + waits, f.seconds_sd, 3),
        }
    return out


def _r(x: float) -> float:
    return round(x, 3)


def _range(mean: float, sd: float, digits: int) -> dict[str, float]:
    return {"low": round(max(mean - sd, 0.0), digits), "high": round(mean + sd, digits)}


def _hit(h: Hit) -> dict[str, Any]:
    out: dict[str, Any] = {"which": h.which, "atStep": h.at_step}
    for key, value in (("run", h.run), ("window", h.window), ("limit", h.limit)):
        if value is not None:
            out[key] = value
    if h.projected is not None:
        out["projected"] = round(h.projected, 6)
    return out


def _step(x: Step) -> dict[str, Any]:
    return {
        "step": x.number,
        "kind": x.kind,
        "prompt": round(x.prompt),
        "completion": round(x.completion),
        "seconds": _r(x.turn_seconds + x.tool_seconds + x.wait_seconds),
        "waitSeconds": _r(x.wait_seconds),
    }
