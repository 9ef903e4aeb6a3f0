"""The run tree for GET /status: each run's own work and its subtree's totals.

Pure module: no I/O; it reads run states (`machine.RunState`) through any mapping whose values
have a `.state` (`budget.HasState`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from luftpause.runtime.core import budget
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.budget import HasState
from luftpause.runtime.core.price import usd

_KEYS = (
    "turns",
    "toolCalls",
    "failedToolCalls",
    "promptTokens",
    "cachedPromptTokens",
    "completionTokens",
    "turnSeconds",
    "toolSeconds",
)


def own_work(state: m.RunState) -> dict[str, float]:
    u = state.usage
    return {
        "turns": u.turns,
        "toolCalls": state.tool_calls,
        "failedToolCalls": state.failed_tool_calls,
        "promptTokens": u.prompt_tokens,
        "cachedPromptTokens": u.cached_prompt_tokens,
        "completionTokens": u.completion_tokens,
        "turnSeconds": round(u.turn_seconds, 3),
        "toolSeconds": round(state.tool_seconds, 3),
    }


def status(runs: Mapping[str, HasState], now: float = 0.0) -> dict[str, Any]:
    """Roots first, children nested; every node has `own` and `subtree` totals (USD too); a
    budgeted run its `budget` (seconds measured to `now`), a run waiting for the user its
    `pendingApproval`, a run of a key of the keys file that key's name (`key`).
    """
    children: dict[str | None, list[str]] = {}
    for handle, run in runs.items():
        parent = run.state.spec.parent
        children.setdefault(parent if parent in runs else None, []).append(handle)

    def node(handle: str) -> dict[str, Any]:
        state = runs[handle].state
        kids = [node(h) for h in children.get(handle, [])]
        own = own_work(state)
        subtree = {k: own[k] + sum(kid["subtree"][k] for kid in kids) for k in _KEYS}
        # USD at each run's price (`price_table`); None where no run of it has one, never 0.
        cost = budget.cost(state)
        costs = [c for c in (cost, *(kid["subtree"]["usd"] for kid in kids)) if c is not None]
        out = {
            "handle": handle,
            "state": state.phase.value,
            "task": state.spec.task[:200],
            "model": state.spec.model,
            "serviceClass": state.spec.service_class,
            "own": own | {"usd": None if cost is None else usd(cost)},
            "subtree": {k: round(v, 3) for k, v in subtree.items()}
            | {"usd": usd(sum(costs)) if costs else None},
            "children": kids,
        }
        if state.spec.key is not None:
            out["key"] = state.spec.key
        pending = m.summary(state).get("pendingApproval")
        if pending is not None:
            out["pendingApproval"] = pending
        view = budget.view(runs, handle, now)
        if view is not None:
            out["budget"] = view
        return out

    roots = [node(h) for h in children.get(None, [])]
    phases: dict[str, int] = {}
    for run in runs.values():
        phases[run.state.phase.value] = phases.get(run.state.phase.value, 0) + 1
    return {"runs": len(runs), "byState": phases, "tree": roots}
