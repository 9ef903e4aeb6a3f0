"""A read-only view of the scheduler state for /status, the Status RPC and metrics.

Pure module: no I/O; `now` is passed in.
"""

from __future__ import annotations

from typing import Any

from luftpause.scheduler.core import shares, slots
from luftpause.scheduler.core.budget_status import budgets_view
from luftpause.scheduler.core.model import Phase, ServiceClass
from luftpause.scheduler.core.room import is_open
from luftpause.scheduler.core.state import State

_WAITS = {"r": "replica", "m": "new_run", "o": "room", "s": "single_pass"}


def status_view(state: State, now: float) -> dict[str, Any]:
    """Replicas with load against capacity, held turns by class and caller, runs by phase."""
    resident: dict[str, int] = {}
    paused: dict[str, int] = {}
    for run in state.runs.values():
        if run.footprint:
            resident[run.replica] = resident.get(run.replica, 0) + 1
        if (
            run.replica
            and run.phase is Phase.TOOL_PAUSED
            and run.service_class is ServiceClass.INTERACTIVE
        ):
            paused[run.replica] = paused.get(run.replica, 0) + 1
    replicas = [
        {
            "id": r.id,
            "url": r.url,
            "kind": str(r.kind),
            "models": sorted(r.models),
            "healthy": r.healthy,
            "in_flight": r.in_flight,
            "interactive_in_flight": r.interactive_in_flight,
            # Prompt tokens its turns in flight have yet to read (see `cost`).
            "pending_prefill_tokens": r.pending_prefill,
            "capacity": r.capacity,
            "capped": r.capacity is not None,
            "unread": r.unread,
            "engine_running": r.engine_running,
            "engine_waiting": r.engine_waiting,
            # Interactive runs paused on a tool whose home is this replica, and of those the
            # slots batch leaves free for their return (only with the `headroom` rule on).
            "paused_interactive": paused.get(r.id, 0),
            "headroom_kept": r.paused_interactive,
            "preemptive": r.preemptive,
            "open": is_open(r),
            # The engine's KV pool against the working set of the runs resident there.
            "kv": {
                "tokens": r.kv_tokens,
                "used": r.kv_used,
                "bound": r.kv_bound,
                "resident_tokens": r.resident_tokens,
                "resident_runs": resident.get(r.id, 0),
                "new_batch_fits": r.new_batch_fits,
                "new_interactive_fits": r.new_interactive_fits,
                # New runs may start past the margin while nothing waits to be read there: it
                # reads its pool again faster than paused runs come back (`residency.spills`).
                "spills": r.spills,
                # Opening keys (tools and first messages) it served lately: see `openings`.
                "openings": len(state.openings[r.id].keys) if r.id in state.openings else 0,
                "prefill_ms_per_token": None
                if r.prefill.s_per_token is None
                else round(r.prefill.s_per_token * 1000, 4),
                # The least time to first token per uncached token seen: the engine's reading.
                "read_ms_per_token": None
                if r.read_s_per_token is None
                else round(r.read_s_per_token * 1000, 5),
            },
            # Engine slots the scheduler assigns: the run each holds, and whether one is busy.
            "slots": [
                {"slot": i, "run": run or None, "busy": i in r.busy_slots}
                for i, run in enumerate(r.slot_runs)
            ],
            # Save files on its engine (endpoint `slot_saves`): the run whose context each holds.
            "saves": [
                {"file": slots.save_file(r.id, i), "run": run or None}
                for i, run in enumerate(r.saves)
            ],
        }
        for r in sorted(state.replicas.values(), key=lambda r: r.id)
    ]
    groups: dict[tuple[str, str], tuple[int, float]] = {}
    for t in (*state.held.values(), *state.budget_held.values()):
        key = (str(t.service_class), t.caller)
        count, oldest = groups.get(key, (0, now))
        groups[key] = (count + 1, min(oldest, t.arrived_at))
    held = [
        {
            "class": cls,
            "caller": caller,
            "count": count,
            "oldest_wait_s": round(max(now - oldest, 0.0), 3),
        }
        for (cls, caller), (count, oldest) in sorted(groups.items())
    ]
    # What each held turn waits for: its run's replica (pinned, or resident there), room for a
    # new run (the KV rule may hold it), any room (held by the KV rule long enough), room on a
    # single-pass replica, or a rate-limit budget.
    waits = {"replica": 0, "new_run": 0, "room": 0, "single_pass": 0, "budget": 0}
    for t in state.held.values():
        waits[_WAITS[t.bucket[0]]] += 1
    waits["budget"] = len(state.budget_held)
    runs: dict[str, dict[str, int]] = {str(p): {str(c): 0 for c in ServiceClass} for p in Phase}
    for run in state.runs.values():
        runs[str(run.phase)][str(run.service_class)] += 1
    sizes = state.sizes
    return {
        # The placement rules in force (`model.Rules`; all but headroom by default).
        "rules": {name: getattr(state.rules, name) for name in state.rules.names()},
        "interactive_weight": state.rules.interactive_weight,
        # Per model, interactive's part of its pool's turn-seconds lately, the turn-seconds it
        # had beyond its weighted share, and whether batch goes first for it (`core.shares`).
        "shares": {model: _share_view(state, model, now) for model in sorted(state.shares)},
        "replicas": replicas,
        # What the scheduler learned from reported usage (see `core.learned`).
        "learned": {
            "tokens_per_byte": round(sizes.tokens_per_byte, 4),
            "reply_tokens": round(sizes.reply_tokens, 1),
            "growth_tokens": round(sizes.growth_tokens, 1),
            "new_run_tokens": round(sizes.new_run_tokens, 1),
            # How long a run stays resident after a turn that ended with or without tool calls
            # (over all runs; per rounds finished where it differs).
            "residency_s": {
                f"{cls}/{'tool' if tool else 'idle'}"
                + ("" if rounds < 0 else f"/round {rounds}"): round(c.window(tool_calls=tool), 3)
                for (cls, tool, rounds), c in sorted(state.comebacks.items())
                if c.ends >= 1
            },
        },
        "held": held,
        "held_total": len(state.held) + len(state.budget_held),
        "held_waiting_for": waits,
        # Rate-limit windows: hosted endpoints' and caller keys' (see `core.gate`).
        "budgets": budgets_view(state, now),
        "runs": runs,
        "runs_total": len(state.runs),
        "turns_in_flight": len(state.turns),
        "dataplanes": [
            {
                "id": dp,
                "streams": link.streams,
                "gone_s": None if link.gone_since is None else round(now - link.gone_since, 3),
            }
            for dp, link in sorted(state.dataplanes.items())
        ],
    }


def _share_view(state: State, model: str, now: float) -> dict[str, Any]:
    share = state.shares[model]
    return {
        "interactive_part": round(shares.part(share, now), 3),
        "interactive_owed_s": round(shares.owed(share, state.rules.interactive_weight, now), 3),
        "past_share": shares.past_share(state, model, now),
    }
