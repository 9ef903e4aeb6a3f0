"""A provider's rate-limit readings, and what they teach a window (`windows`).

Pure module: functions that return updated windows; time is an argument. A reading counts its
own turn; each budget keeps the lower of what it held and what the reading says, both aged to
the reading's arrival (readings of requests sent together arrive in any order); a reset is never
taken earlier than the headers allow; a 429 cools the window down and raises k. Every budget of
a reading votes on the window's refill regime (`_voted`).
"""

from __future__ import annotations

from typing import Any

from luftpause.common.ratelimits import Reading
from luftpause.scheduler.core.model import evolve
from luftpause.scheduler.core.windows import (
    K_MAX,
    K_UP,
    Level,
    Pending,
    Refill,
    Regime,
    Window,
    advance,
    level_at,
    minus,
)

COOLDOWN_DEFAULT_S = 1.0
"""A 429 that says nothing of when to come back cools its window down this long."""

VOTES = 5
"""The regime is the majority of the last this many votes (a tie is fixed)."""

VOTE_MARGIN_S = 0.25
IMPLIED_COARSE_S = 0.5
"""How precise a reading's reset is taken to be when it votes (`_voted`): its arrival time is
off by a request's latency, and a reset given in whole seconds by half a second."""


def observe(
    window: Window,
    reading: Reading,
    at: float,
    *,
    sent_at: float | None = None,
    turn_id: str = "",
    refused: bool,
) -> Window:
    """A provider's reading: its headers arrived at `at`, the request they answer was sent at
    `sent_at` (default `at`). It counts `turn_id`, the reply's own turn; its levels are dated
    `at`, which is never early. Each budget keeps the lower of what it held and what the
    reading says, both aged to `at` (see the module). A refusal cools the window down (from
    `at`) and makes predictions more cautious."""
    sent = at if sent_at is None else min(sent_at, at)
    window = advance(window, at)
    changes: dict[str, Any] = {}
    if refused:
        wait = reading.retry_after_s
        if wait is None:
            spent = [b.reset_s for b in reading.budgets.values() if b.remaining == 0 and b.reset_s]
            wait = max(spent) if spent else COOLDOWN_DEFAULT_S
        changes["cooldown_until"] = max(window.cooldown_until, at + wait)
        changes["caution"] = evolve(window.caution, k=min(window.caution.k + K_UP, K_MAX))
        changes["provider_429s"] = window.provider_429s + 1
    if not reading.budgets:
        return _count_turn(evolve(window, **changes), turn_id)
    window = _voted(window, reading, at)
    levels = window.levels
    for name, budget in reading.budgets.items():
        old = levels.get(name, Level())
        limit = budget.limit if budget.limit is not None else old.limit
        remaining = budget.remaining
        if remaining is None:
            continue
        limit = max(limit, remaining)
        full_at = _reset_at(old if name in levels else None, budget.reset_s, at, window.regime)
        period = old.period_s
        if budget.reset_s and limit > remaining and window.regime is Regime.CONTINUOUS:
            # A bucket's reset is exactly (limit - remaining) / limit periods.
            period = min(max(budget.reset_s * limit / (limit - remaining), 0.5), 86400.0)
        new = Level(limit=limit, base=float(remaining), at=at, full_at=full_at, period_s=period)
        if name in levels and not window.own:
            held = level_at(old, window.regime, at)
            if held < level_at(new, window.regime, at):
                new = Level(
                    limit=limit,
                    base=min(held, float(limit)),
                    at=at,
                    full_at=full_at,
                    period_s=period,
                )
        levels = levels.set(name, new)
    if window.own:  # stated limits gave a bucket of our own: the provider's regime is learned
        changes["refill"] = evolve(window.refill, regime=Regime.UNKNOWN, votes=())
    read_at = max(window.read_at, sent)
    window = evolve(window, levels=levels, read_at=read_at, own=False, **changes)
    return _count_turn(window, turn_id)


def _reset_at(old: Level | None, reset_s: float | None, at: float, regime: Regime) -> float | None:
    """When a budget is full again by a reading whose headers arrived at `at`. A provider says
    its reset relative to when it wrote the headers, some time between the request's arrival
    and `at`: `at + reset_s` is never early. Of the readings of one fixed window the earliest
    is the closest (a reset more than half a period later is the next window's); a bucket's
    full time moves later with every charge, so until the regime is known to be fixed the
    latest of them stands, which is never early for either."""
    if reset_s is None:
        return None
    when = at + reset_s
    if old is None or old.full_at is None or old.guessed or old.full_at < at:
        return when
    if regime is not Regime.FIXED:
        return max(when, old.full_at)
    if when > old.full_at + old.period_s / 2:
        return when
    return min(when, old.full_at)


def _count_turn(window: Window, turn_id: str) -> Window:
    """Mark `turn_id`'s reservation counted (its own reply's reading counted it)."""
    p = window.pending.get(turn_id)
    if p is None or p.counted:
        return window
    counted = Pending(cost=p.cost, counted=True, scale=p.scale)
    return evolve(
        window,
        pending=window.pending.set(turn_id, counted),
        uncounted=minus(window.uncounted, p.cost),
    )


def _voted(window: Window, reading: Reading, at: float) -> Window:
    """Cast the reading's votes on the regime (see the module's docstring), a vote per budget.

    Against the last reading of the same budget: a bucket that refills `limit` per period says
    a reset (until full) of (limit - remaining) / limit periods, so it implies the same period
    every time; a fixed window's reset runs down with the clock, whatever was used. When the
    two predictions of this reset are closer than the readings are precise (readings moments
    apart, little used between them), the budget does not vote."""
    voters = window.refill.voters
    votes = window.refill.votes
    for name, budget in reading.budgets.items():
        if budget.reset_s is None or budget.remaining is None or not budget.limit:
            continue
        if budget.remaining >= budget.limit or budget.reset_s <= 0:
            continue
        used = (budget.limit - budget.remaining) / budget.limit
        last = voters.get(name)
        voters = voters.set(name, (budget.reset_s / used, budget.reset_s, at))
        if last is None or at < last[2]:
            continue
        implied, reset, then = last
        as_bucket = implied * used
        as_fixed = reset - (at - then)
        # Arrival times are off by a request's latency; resets in whole seconds by half a second.
        coarse = float(budget.reset_s).is_integer()
        margin = max(VOTE_MARGIN_S + (IMPLIED_COARSE_S if coarse else 0.0), 0.05 * budget.reset_s)
        if abs(as_bucket - as_fixed) < 2 * margin:
            continue
        fixed = abs(budget.reset_s - as_fixed) < abs(budget.reset_s - as_bucket)
        votes = (*votes, fixed)[-VOTES:]
    if votes == window.refill.votes:
        return evolve(window, refill=evolve(window.refill, voters=voters))
    regime = Regime.FIXED if 2 * sum(votes) >= len(votes) else Regime.CONTINUOUS
    return evolve(window, refill=Refill(regime=regime, votes=votes, voters=voters))
