"""Budgets over a subtree: what a budgeted run and every run below it used, and which limit
is past.

Pure module: no I/O, no clock reads (`now` is an argument); reads run states through any
mapping whose values have a `.state` (`HasState`). A run's budget (spawn's budgetTokens,
budgetToolCalls, budgetSeconds, budgetUsd) counts its own work and that of every run spawned
under it, later ones included:

    tokens     prompt plus completion tokens of every turn (a turn whose tool calls are still
               running counts already)
    toolCalls  tool calls of every complete round
    seconds    wall-clock from the budgeted run's spawn until now, or until the last run of the
               subtree ended once all of them have
    usd        what those tokens cost at each run's own price (`price`, frozen in its spec);
               only when every run of the subtree has one (`price_table` refuses a run without one
               under a USD budget)

A limit is past when the use is greater than it. The shell checks after every turn and tool
round anywhere below a budgeted run, on every spawn into its subtree, and by a timer at
spawn + budgetSeconds so an idle subtree trips too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from luftpause.runtime.core import machine as m
from luftpause.runtime.core.price import usd


class HasState(Protocol):
    """A run as the pure readers see it: its state machine's state."""

    @property
    def state(self) -> m.RunState: ...


def limits(spec: m.RunSpec) -> dict[str, float]:
    """The limits a run was spawned with, by kind; empty when it has no budget."""
    given = {
        "tokens": spec.budget_tokens,
        "toolCalls": spec.budget_tool_calls,
        "seconds": spec.budget_seconds,
        "usd": spec.budget_usd,
    }
    return {k: v for k, v in given.items() if v is not None}


def children(runs: Mapping[str, HasState]) -> dict[str, list[str]]:
    """Parent handle -> its children's handles."""
    out: dict[str, list[str]] = {}
    for handle, run in runs.items():
        parent = run.state.spec.parent
        if parent is not None:
            out.setdefault(parent, []).append(handle)
    return out


def subtree(handle: str, kids: Mapping[str, list[str]]) -> list[str]:
    """The run and every run below it."""
    out, frontier = [], [handle]
    while frontier:
        h = frontier.pop()
        out.append(h)
        frontier += kids.get(h, [])
    return out


def ancestors(runs: Mapping[str, HasState], handle: str) -> list[str]:
    """The run itself, then its parent, up to the root."""
    out: list[str] = []
    h: str | None = handle
    while h is not None and h in runs and h not in out:
        out.append(h)
        h = runs[h].state.spec.parent
    return out


def used(
    runs: Mapping[str, HasState],
    handle: str,
    now: float,
    kids: Mapping[str, list[str]] | None = None,
) -> dict[str, float]:
    """What the subtree under `handle` used so far, by kind."""
    states = [runs[h].state for h in subtree(handle, children(runs) if kids is None else kids)]
    tokens = sum(
        s.usage.prompt_tokens
        + s.usage.completion_tokens
        + s.pending_usage.prompt_tokens
        + s.pending_usage.completion_tokens
        for s in states
    )
    over_all = all(s.phase.over for s in states)
    end = max(s.ended_at or now for s in states) if over_all else now
    seconds = max(0.0, end - runs[handle].state.spec.spawned_at)
    out: dict[str, float] = {
        "tokens": tokens,
        "toolCalls": sum(s.tool_calls for s in states),
        "seconds": round(seconds, 3),
    }
    costs = [cost(s) for s in states]
    if all(c is not None for c in costs):  # a cost some runs lack is unknown, never 0
        out["usd"] = usd(sum(c or 0.0 for c in costs))
    return out


def cost(state: m.RunState) -> float | None:
    """USD of a run's turns (a turn whose tool calls are still running included); None when
    it has no price."""
    price = state.spec.price
    if price is None:
        return None
    u, p = state.usage, state.pending_usage
    return price.cost(
        prompt=u.prompt_tokens + p.prompt_tokens,
        cached=u.cached_prompt_tokens + p.cached_prompt_tokens,
        completion=u.completion_tokens + p.completion_tokens,
    )


def over(limit: Mapping[str, float], use: Mapping[str, float]) -> m.Exceeded | None:
    """The first limit (tokens, toolCalls, seconds, usd) the use is past, if any."""
    for which in m.BUDGET_KINDS:
        if which in limit and which in use and use[which] > limit[which]:
            return m.Exceeded(which=which, used=use[which], limit=limit[which])
    return None


def check(runs: Mapping[str, HasState], handle: str, now: float) -> list[tuple[str, m.Exceeded]]:
    """Every budgeted run at or above `handle` whose budget is newly past: (run, what)."""
    kids: dict[str, list[str]] | None = None  # every run is looked at only if one has a budget
    out = []
    for h in ancestors(runs, handle):
        state = runs[h].state
        limit = limits(state.spec)
        if not limit or state.exceeded is not None:
            continue
        if kids is None:
            kids = children(runs)
        exceeded = over(limit, used(runs, h, now, kids))
        if exceeded is not None:
            out.append((h, exceeded))
    return out


def blocking(runs: Mapping[str, HasState], handle: str) -> m.Exceeded | None:
    """The exceeded budget of `handle` or a run above it: nothing more may start under it."""
    for h in ancestors(runs, handle):
        if runs[h].state.exceeded is not None:
            return runs[h].state.exceeded
    return None


def deadline(spec: m.RunSpec) -> float | None:
    """When a seconds budget runs out (wall clock), if the run has one."""
    return None if spec.budget_seconds is None else spec.spawned_at + spec.budget_seconds


def view(runs: Mapping[str, HasState], handle: str, now: float) -> dict[str, Any] | None:
    """What status and await show as a run's `budget`; None when it has none."""
    state = runs[handle].state
    limit = limits(state.spec)
    if not limit:
        return None
    exceeded = state.exceeded
    return {
        "limits": limit,
        "used": used(runs, handle, now),
        "exceeded": None if exceeded is None else exceeded.to_json() | {"reason": exceeded.reason},
    }
