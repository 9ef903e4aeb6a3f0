"""Rate-limit waits ahead of a run: the scheduler's budget windows, played forward over the
turns a forecast projects.

Pure module: no I/O, no clock (times are seconds from the forecast's now). The scheduler's
`GET /status` lists a `budgets` entry per rate-limit window (a hosted endpoint's, or a caller
key's `key:<name>`), each dimension with its `limit`, what is `available` now, what admitted
turns `reserved`, and `refill_s`: seconds until a fixed window resets, or until a bucket is full
again. `windows_for` picks the windows a run's turns count against: the run's key's window, and
of the endpoint windows serving its model the one with the most headroom (the scheduler places a
turn where it fits). `Playback` then takes each turn in order: a turn that does not fit waits
for the refill it needs (a fixed window's next reset, a bucket's rate), then takes its share.

What it does not know: the turns other runs will send meanwhile (only their reservations now
count), and a window's period when it says none (a minute, as providers state them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PERIOD_S = 60.0
DAILY = "daily_tokens"


@dataclass(frozen=True, slots=True, kw_only=True)
class Dimension:
    name: str
    limit: float
    available: float
    reserved: float = 0.0
    refill_s: float = -1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    id: str
    kind: str = "endpoint"
    regime: str = "fixed"
    dimensions: tuple[Dimension, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """One turn as the windows count it."""

    prompt: float
    completion: float

    def cost(self, dimension: str) -> float:
        if dimension == "requests":
            return 1.0
        if dimension == "input_tokens":
            return self.prompt
        if dimension == "output_tokens":
            return self.completion
        return self.prompt + self.completion  # tokens, daily_tokens


def parse_windows(status: Mapping[str, Any]) -> list[Window]:
    """The windows of a scheduler `/status` document (entries that do not parse are skipped)."""
    out = []
    for raw in status.get("budgets") or ():
        try:
            dims = tuple(
                Dimension(
                    name=str(d["name"]),
                    limit=float(d["limit"]),
                    available=float(d["limit"] if d.get("available") is None else d["available"]),
                    reserved=float(d.get("reserved") or 0.0),
                    refill_s=float(-1.0 if d.get("refill_s") is None else d["refill_s"]),
                )
                for d in raw.get("dimensions") or ()
            )
            out.append(
                Window(
                    id=str(raw["id"]),
                    kind=str(raw.get("kind", "endpoint")),
                    regime=str(raw.get("regime", "fixed")),
                    dimensions=dims,
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return out


def windows_for(status: Mapping[str, Any], model: str, key: str | None) -> list[Window]:
    """The windows a run of `model` (belonging to `key`, if any) counts against."""
    replicas = status.get("replicas") or ()
    serving = {str(r.get("id")) for r in replicas if model in (r.get("models") or ())}
    windows = parse_windows(status)
    endpoints = [
        w
        for w in windows
        if w.kind != "key" and serving & {str(r) for r in _replicas_of(status, w.id)}
    ]
    out = []
    if endpoints:
        out.append(max(endpoints, key=_headroom))
    if key is not None:
        out += [w for w in windows if w.kind == "key" and w.id == f"key:{key}"]
    return out


def _replicas_of(status: Mapping[str, Any], window_id: str) -> Iterable[Any]:
    for raw in status.get("budgets") or ():
        if raw.get("id") == window_id:
            return raw.get("replicas") or ()
    return ()


def _headroom(window: Window) -> float:
    """The smallest share of a dimension still free (1: untouched)."""
    shares = [
        max(d.available - d.reserved, 0.0) / d.limit for d in window.dimensions if d.limit > 0
    ]
    return min(shares, default=1.0)


class _Level:
    """One dimension played forward."""

    def __init__(self, d: Dimension, continuous: bool) -> None:
        self.name = d.name
        self.limit = d.limit
        self.level = max(d.available - d.reserved, 0.0)
        self.continuous = continuous and d.name != DAILY
        self.rate = d.limit / PERIOD_S
        self.reset = d.refill_s if d.refill_s >= 0 else PERIOD_S
        self.at = 0.0

    def advance(self, t: float) -> None:
        if self.name == DAILY:
            return  # a day's tokens do not come back within a run
        if self.continuous:
            self.level = min(self.limit, self.level + self.rate * (t - self.at))
        elif t >= self.reset:
            self.level = self.limit
            self.reset += PERIOD_S * (1 + math.floor((t - self.reset) / PERIOD_S))
        self.at = t

    def wait(self, cost: float, t: float) -> float:
        """Seconds from `t` until `cost` fits; inf if it never will."""
        if self.level >= cost:
            return 0.0
        if cost > self.limit or self.name == DAILY:
            return math.inf
        if self.continuous:
            return (cost - self.level) / self.rate if self.rate > 0 else math.inf
        return max(self.reset - t, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Blocked:
    """A turn that no wait lets through: over a daily budget, or larger than a window."""

    window: str
    dimension: str
    at_step: int


class Playback:
    """The windows of a run, turn after turn."""

    def __init__(self, windows: Sequence[Window]) -> None:
        self._levels = [
            (w.id, _Level(d, w.regime == "continuous")) for w in windows for d in w.dimensions
        ]
        self.blocked: Blocked | None = None

    def take(self, step: int, demand: Demand, t: float) -> float:
        """The wait before the turn of `step` starting at `t`, then its share taken."""
        if self.blocked is not None:
            return 0.0
        for _, lv in self._levels:
            lv.advance(t)
        waits = [(lv.wait(demand.cost(lv.name), t), wid, lv) for wid, lv in self._levels]
        wait = max((w for w, _, _ in waits), default=0.0)
        if math.isinf(wait):
            _, wid, lv = next(x for x in waits if math.isinf(x[0]))
            self.blocked = Blocked(window=wid, dimension=lv.name, at_step=step)
            return 0.0
        for _, lv in self._levels:
            lv.advance(t + wait)
            lv.level -= demand.cost(lv.name)
        return wait
