"""Rate-limit windows: what a hosted endpoint, or a caller key, has left, and when it refills.

Pure module: frozen values and functions that return updated ones; time is an argument.

A window has a `Level` per budget it knows (requests, tokens, input and output tokens, per
minute; a key's tokens per day apart, see `gate`). A level is the provider's count as of its
last reading, aged by the window's refill regime:

- fixed: nothing comes back until the window resets (`full_at`), then all of it;
- continuous: a token bucket, refilling `limit` per `period_s` (a minute) without pause;
- unknown: as fixed, which is right or cautious for both (a continuous bucket is full by the
  time its reset says). A provider's regime is learned from successive readings: a bucket's
  reset always implies the same period (reset x limit / used), a fixed window's does not
  (`_voted`).

A limit stated in the endpoint file, or a caller key's, is a bucket of our own, starting full.

What admitted turns will cost is reserved on admission (`reserve`) and taken off what the
level says (`available`) until the turn's own reply brings a reading, which counts it: a
provider's count as of admitting a request includes that request. Readings of requests sent
at nearly the same moment arrive in any order, and a reading says nothing of which other
requests it counted, so the level is the lowest of what the readings say once aged to the same
moment (a newer count is never higher, but for a refill), and a turn whose reply had no reading
has its real cost (the reply's usage) taken off the level at its end. This counts some turns
twice while they are in flight, never none: the window never admits more than the provider's
count allows.

After a provider's 429 the window cools down until it said to come back, and `k`, the safety
factor on predicted replies (mean + k sigma), rises by K_UP up to K_MAX; each turn that ends
well takes K_DECAY off it again, down to K_START.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import immutables

from luftpause.common.ratelimits import BUDGETS
from luftpause.scheduler.core.learned import Replies
from luftpause.scheduler.core.model import evolve

MINUTE_S = 60.0
K_START = 2.0
K_UP = 0.5
K_MAX = 4.0
K_DECAY = 0.05
Cost = tuple[int, int, int, int]
"""What a turn costs, by `BUDGETS` (requests, tokens, input tokens, output tokens)."""

NO_COST: Cost = (0, 0, 0, 0)
_NO_MISSES = Replies()
_EMPTY: immutables.Map[Any, Any] = immutables.Map()


class Regime(StrEnum):
    UNKNOWN = "unknown"
    FIXED = "fixed"
    CONTINUOUS = "continuous"


@dataclass(frozen=True, slots=True, kw_only=True)
class Level:
    """One budget: its limit per period, what was left at `at`, and when it is next full."""

    limit: int = 0
    base: float = 0.0
    at: float = 0.0
    # When a fixed window resets, or a bucket is full again (None: not known).
    full_at: float | None = None
    period_s: float = MINUTE_S
    # `full_at` is a guess (a period after a reset passed), not a provider's word.
    guessed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Pending:
    """A turn's reservation: its predicted cost, and whether the provider's count includes it
    already (its own reply's reading did)."""

    cost: Cost
    counted: bool = False
    # The window's `scale()` the cost was predicted with: (prompt, reply). Its misses are
    # learned unscaled.
    scale: tuple[float, float] = (1.0, 1.0)


class WindowKind(StrEnum):
    ENDPOINT = "endpoint"  # an endpoint's, or the endpoints' sharing one API key
    KEY = "key"  # a caller key's budget


@dataclass(frozen=True, kw_only=True)
class Refill:
    """How the provider refills a window, as its readings taught (`readings._voted`)."""

    regime: Regime = Regime.UNKNOWN
    votes: tuple[bool, ...] = ()  # True: a vote for fixed
    # Per budget, its last reading for the next vote: the period it implied, its reset, when
    # it came.
    voters: immutables.Map[str, tuple[float, float, float]] = _EMPTY


@dataclass(frozen=True, kw_only=True)
class Caution:
    """How cautious a window's predictions are: `k`, the safety factor (mean + k sigma), and
    what turns' prompts and replies really were over what was predicted for them. The
    predictions are scaled by mean + k sigma of that, so one that keeps falling short stops
    admitting past the budget (a reply apart, for a provider's budget of output tokens)."""

    k: float = K_START
    misses: tuple[Replies, Replies] = (_NO_MISSES, _NO_MISSES)

    def scale(self) -> tuple[float, float]:
        """The factors on predicted (prompt, reply) tokens: 1 until three turns ended, never
        below 1."""
        return (_factor(self.misses[0], self.k), _factor(self.misses[1], self.k))


@dataclass(frozen=True, kw_only=True)
class DailyBudget:
    """A caller key's tokens per UTC day: `limit` (0: none), the `day` (Unix days) and what it
    `used` then."""

    limit: int = 0
    day: int = -1
    used: int = 0


_NO_REFILL = Refill()
_CAUTION = Caution()
_NO_DAILY = DailyBudget()


@dataclass(frozen=True, kw_only=True)
class Window:
    """A rate-limit window: an endpoint's (or endpoints sharing one API key), or a key's."""

    id: str
    kind: WindowKind = WindowKind.ENDPOINT
    replicas: tuple[str, ...] = ()
    levels: immutables.Map[str, Level] = _EMPTY
    # Our own bucket (stated limits, a key's budget): no provider readings.
    own: bool = False
    refill: Refill = _NO_REFILL
    read_at: float = -1.0
    cooldown_until: float = 0.0
    pending: immutables.Map[str, Pending] = _EMPTY
    # Derived: the sum of the pending reservations' costs not yet counted.
    uncounted: Cost = NO_COST
    # The provider counts a request's max_tokens up front (endpoint `limits.charges`; the
    # default, as OpenAI's and Anthropic's do): a reply reserves it whole.
    charges_max_tokens: bool = True
    refused: int = 0
    provider_429s: int = 0
    daily: DailyBudget = _NO_DAILY
    caution: Caution = _CAUTION

    @property
    def regime(self) -> Regime:
        return self.refill.regime


def _factor(misses: Replies, k: float) -> float:
    seen = misses.predict(k)
    return 1.0 if seen is None else max(1.0, seen)


def stated(
    window_id: str,
    per_minute: dict[str, int],
    at: float,
    *,
    kind: WindowKind = WindowKind.ENDPOINT,
    replicas: tuple[str, ...] = (),
    charges_max_tokens: bool = True,
    period_s: float = MINUTE_S,
) -> Window:
    """A window of our own from stated limits per `period_s` (a minute), full at `at`."""
    levels = {
        name: Level(limit=limit, base=float(limit), at=at, full_at=at, period_s=period_s)
        for name, limit in per_minute.items()
        if limit > 0
    }
    return Window(
        id=window_id,
        kind=kind,
        replicas=replicas,
        levels=immutables.Map(levels),
        own=True,
        refill=Refill(regime=Regime.CONTINUOUS),
        charges_max_tokens=charges_max_tokens,
    )


def restate(window: Window, per_minute: dict[str, int], at: float) -> Window:
    """`window` with changed stated limits (a key file reloaded): what was used stays used."""
    levels = dict(window.levels)
    for name in BUDGETS:
        limit = per_minute.get(name, 0)
        old = levels.get(name)
        if limit <= 0:
            levels.pop(name, None)
        elif old is None:
            levels[name] = Level(limit=limit, base=float(limit), at=at, full_at=at)
        elif old.limit != limit:
            now = level_at(old, window.regime, at)
            levels[name] = Level(limit=limit, base=min(now, float(limit)), at=at)
    return evolve(window, levels=immutables.Map(levels))


# --- levels -----------------------------------------------------------------------------------


def level_at(level: Level, regime: Regime, now: float) -> float:
    """What `level` holds at `now` by `regime` (after `advance`, for fixed windows)."""
    if regime is Regime.CONTINUOUS and level.limit:
        rate = level.limit / level.period_s
        return min(float(level.limit), level.base + max(now - level.at, 0.0) * rate)
    if level.full_at is not None and now >= level.full_at and level.limit:
        return float(level.limit)
    return level.base


def advance(window: Window, now: float) -> Window:
    """`window` as of `now`: a fixed (or unknown) window past its reset starts full again (the
    turns in flight stay reserved: which window counts them is not known)."""
    if window.regime is Regime.CONTINUOUS:
        return window
    rolled: dict[str, Level] = {}
    for name, level in window.levels.items():
        if level.full_at is not None and now >= level.full_at and level.limit:
            periods = math.floor((now - level.full_at) / level.period_s) + 1
            start = level.full_at + (periods - 1) * level.period_s
            rolled[name] = Level(
                limit=level.limit,
                base=float(level.limit),
                at=start,
                full_at=start + level.period_s,
                period_s=level.period_s,
                guessed=True,
            )
    if not rolled:
        return window
    levels = window.levels
    for name, level in rolled.items():
        levels = levels.set(name, level)
    return evolve(window, levels=levels)


def available(window: Window, name: str, now: float) -> float | None:
    """What budget `name` has for new turns at `now` (None: the window does not know it)."""
    level = window.levels.get(name)
    if level is None:
        return None
    return level_at(level, window.regime, now) - window.uncounted[BUDGETS.index(name)]


def fits(window: Window, cost: Cost, now: float) -> bool:
    """Whether a turn of `cost` may start now (`window` advanced to `now`). A cost over a
    whole limit fits a full window: it can never fit better (`never_fits` refuses the rest).
    A provider's window not read yet takes one turn at a time: its reply brings a reading."""
    if now < window.cooldown_until:
        return False
    if not window.levels:
        return window.own or not window.pending
    for index, name in enumerate(BUDGETS):
        level = window.levels.get(name)
        if level is None or not cost[index]:
            continue
        need = min(cost[index], level.limit) if level.limit else cost[index]
        if level_at(level, window.regime, now) - window.uncounted[index] < need:
            return False
    return True


def never_fits(window: Window, cost: Cost) -> str:
    """Why a turn whose certain cost (its prompt) is `cost` can never fit ('' if it can)."""
    for index, name in enumerate(BUDGETS):
        level = window.levels.get(name)
        if level is not None and level.limit and cost[index] > level.limit:
            return (
                f"the request needs about {cost[index]} {name.replace('_', ' ')} but "
                f"{window.id}'s whole window is {level.limit} per {_per(level.period_s)}"
            )
    return ""


def _per(period_s: float) -> str:
    return "minute" if period_s == MINUTE_S else f"{period_s:g} s"


def fit_at(window: Window, cost: Cost, now: float) -> float | None:
    """When a turn of `cost` fits if nothing else changes (None: only a turn's end can help)."""
    if not window.levels and window.pending and not window.own:
        return None
    when = max(now, window.cooldown_until)
    for index, name in enumerate(BUDGETS):
        level = window.levels.get(name)
        if level is None or not cost[index]:
            continue
        need = (min(cost[index], level.limit) if level.limit else cost[index]) + window.uncounted[
            index
        ]
        if level_at(level, window.regime, when) >= need:
            continue
        if window.regime is Regime.CONTINUOUS and level.limit:
            if need > level.limit:
                return None  # the bucket is full before it fits: it waits for a turn's end
            rate = level.limit / level.period_s
            when = max(when, level.at + (need - level.base) / rate)
        elif level.full_at is not None and level.limit >= need:
            when = max(when, level.full_at)
        else:
            return None
    return when


def refill_s(window: Window, name: str, now: float) -> float:
    """Seconds until budget `name` next refills (fixed) or is full (continuous); -1 unknown."""
    level = window.levels.get(name)
    if level is None:
        return -1.0
    if window.regime is Regime.CONTINUOUS and level.limit:
        missing = level.limit - level_at(level, window.regime, now)
        return max(missing * level.period_s / level.limit, 0.0)
    return -1.0 if level.full_at is None else max(level.full_at - now, 0.0)


# --- reservations -----------------------------------------------------------------------------


def reserve(window: Window, turn_id: str, cost: Cost) -> Window:
    pending = Pending(cost=cost, scale=window.caution.scale())
    return evolve(
        window,
        pending=window.pending.set(turn_id, pending),
        uncounted=_plus(window.uncounted, cost),
    )


def release(window: Window, turn_id: str, actual: Cost | None, at: float, *, ok: bool) -> Window:
    """The turn ended: its reservation goes; `actual` (the reply's usage) comes off the level
    if no reading counted the turn. `ok`: it ended with a reply (k decays)."""
    window = advance(window, at)
    pending = window.pending.get(turn_id)
    if pending is None:
        return window
    changes: dict[str, Any] = {"pending": window.pending.delete(turn_id)}
    caution = window.caution
    if actual is not None and pending.cost[2] > 0 and pending.cost[3] > 0:
        prompt, reply = caution.misses
        misses = (
            prompt.add(actual[2] * pending.scale[0] / pending.cost[2]),
            reply.add(actual[3] * pending.scale[1] / pending.cost[3]),
        )
        caution = evolve(caution, misses=misses)
    if not pending.counted:
        changes["uncounted"] = minus(window.uncounted, pending.cost)
        if actual is not None:
            changes["levels"] = _charged(window, actual, at)
    if ok:
        caution = evolve(caution, k=max(K_START, caution.k - K_DECAY))
    if caution is not window.caution:
        changes["caution"] = caution
    return evolve(window, **changes)


def _charged(window: Window, cost: Cost, at: float) -> immutables.Map[str, Level]:
    levels = window.levels
    for index, name in enumerate(BUDGETS):
        level = levels.get(name)
        if level is None or not cost[index]:
            continue
        now = level_at(level, window.regime, at)
        full_at = level.full_at
        if window.regime is Regime.CONTINUOUS and level.limit:
            full_at = None  # a bucket's full time moves with every charge: refill_s says it
        levels = levels.set(
            name,
            Level(
                limit=level.limit,
                base=now - cost[index],
                at=at,
                full_at=full_at,
                period_s=level.period_s,
            ),
        )
    return levels


def _plus(a: Cost, b: Cost) -> Cost:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def minus(a: Cost, b: Cost) -> Cost:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3])


def rebuild_uncounted(window: Window) -> Cost:
    """The `uncounted` sum recomputed from the reservations (the property tests' check)."""
    total = NO_COST
    for p in window.pending.values():
        if not p.counted:
            total = _plus(total, p.cost)
    return total
