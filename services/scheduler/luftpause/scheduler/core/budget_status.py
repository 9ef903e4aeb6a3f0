"""A read-only view of the rate-limit windows for /status, the Status RPC and metrics.

Pure module: no I/O; `now` is passed in. One entry per window (a rate-limited endpoint, or
endpoints sharing one API key, and each caller key with a budget): per budget its limit, what is
available now (refills included, reservations not), what admitted turns reserved that the
provider has not counted yet, and when it next refills; the learned regime, k, the cooldown,
turns held for it and in flight on it, and its refusals.
"""

from __future__ import annotations

from typing import Any

from luftpause.common.ratelimits import BUDGETS
from luftpause.scheduler.core import gate
from luftpause.scheduler.core import windows as w
from luftpause.scheduler.core.state import State


def budgets_view(state: State, now: float) -> list[dict[str, Any]]:
    held: dict[str, int] = {}
    for turn in state.budget_held.values():
        for wid in gate.held_windows(state, turn):
            held[wid] = held.get(wid, 0) + 1
    views = []
    for window in sorted(state.windows.values(), key=lambda x: (x.kind, x.id)):
        current = w.advance(window, now)
        dims = []
        for index, name in enumerate(BUDGETS):
            level = current.levels.get(name)
            if level is None:
                continue
            left = w.available(current, name, now)
            dims.append(
                {
                    "name": name,
                    "limit": level.limit,
                    "available": None if left is None else round(left + current.uncounted[index]),
                    "reserved": current.uncounted[index],
                    "refill_s": round(w.refill_s(current, name, now), 3),
                }
            )
        daily = current.daily
        if daily.limit:
            dims.append(
                {
                    "name": "daily_tokens",
                    "limit": daily.limit,
                    "available": max(daily.limit - daily.used, 0),
                    "reserved": 0,
                    "refill_s": -1.0,
                }
            )
        views.append(
            {
                "id": window.id,
                "kind": str(window.kind),
                "replicas": list(window.replicas),
                "regime": "stated" if window.own else str(window.regime),
                "k": round(window.caution.k, 3),
                "cooldown_s": round(max(window.cooldown_until - now, 0.0), 3),
                "dimensions": dims,
                "held": held.get(window.id, 0),
                "in_flight": len(window.pending),
                "reading_age_s": None
                if window.read_at < 0
                else round(max(now - window.read_at, 0.0), 3),
                # When the first turn held fits by refill alone (any window's; None: unknown).
                "next_fit_s": round(max(state.wake_at - now, 0.0), 3)
                if state.wake_at >= 0 and held.get(window.id)
                else None,
                "refused": window.refused,
                "provider_429s": window.provider_429s,
                # A key's tokens used today (UTC), its turns' real usage.
                "used_today": window.daily.used if window.kind is w.WindowKind.KEY else None,
            }
        )
    return views
