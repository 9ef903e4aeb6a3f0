"""Hosted-API rate limits: request and token budgets, refilled per window or continuously.

Pure module: the caller passes the simulated time (`now_s`, seconds) and the wall clock
(`wall_s`, Unix seconds, only written into Anthropic's reset times). Up to four budgets, each
set by its flag: requests (`rpm`), tokens (`tpm`), input tokens (`itpm`) and output tokens
(`otpm`). A request's `Cost` is one request, its input tokens and the output tokens charged
for it; the tokens budget takes both. Two refill regimes (`Refill`), over a window of
`window_s` simulated seconds:

- fixed: every budget is whole again at each window boundary; its reset is that boundary;
- continuous (OpenAI's): a token bucket holding at most the limit, refilled at limit/window
  per second; its reset is the time until the bucket is full again.

A request is refused when any budget holds less than its cost; it is charged to no budget
then, and its Retry-After is the time until every budget holds its cost (until full, when the
cost is more than the whole limit). A budget is a frozen `Budget`; `RateLimiter` keeps the
current ones and the `Tally` of what was served, refused and billed. Durations it reports are
real time (simulated time divided by the time scale): the client waits in real time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from luftpause.testkit.engine.ratelimit_headers import (
    BudgetView,
    HeaderFamily,
    format_duration,
    render,
)

Regime = Literal["fixed", "continuous"]
REGIMES: tuple[Regime, ...] = ("fixed", "continuous")
# Each budget by the flag (and `POST /debug/limits` key) that sets it.
BUDGET_FLAGS: dict[str, str] = {
    "rpm": "requests",
    "tpm": "tokens",
    "itpm": "input_tokens",
    "otpm": "output_tokens",
}
# Slack for float arithmetic: waiting exactly the Retry-After must be enough.
_EPS = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """What one request takes from each budget."""

    requests: int = 1
    input_tokens: int = 0
    output_tokens: int = 0

    def __post_init__(self) -> None:
        if min(self.requests, self.input_tokens, self.output_tokens) < 0:
            raise ValueError("a cost is never negative")

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def of(self, budget: str) -> int:
        """The cost to the budget named `budget` (see `BUDGET_FLAGS`)."""
        amounts = {
            "requests": self.requests,
            "tokens": self.tokens,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }
        return amounts[budget]


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """One budget: its limit and how much of it is used, as of simulated time `at_s`."""

    limit: int
    used: float = 0.0
    at_s: float = 0.0

    def __post_init__(self) -> None:
        if self.limit < 1 or self.used < 0:
            raise ValueError("a budget's limit is >= 1 and its use >= 0")

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.limit - self.used + _EPS))

    def fits(self, cost: int) -> bool:
        return cost <= self.limit - self.used + _EPS


@dataclass(frozen=True, slots=True, kw_only=True)
class Refill:
    """How budgets refill: `regime` over a window of `window_s` simulated seconds."""

    regime: Regime = "fixed"
    window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.regime not in REGIMES:
            raise ValueError("the rate-limit regime is fixed or continuous")
        if not self.window_s > 0:
            raise ValueError("the rate-limit window must be > 0 seconds")

    def advance(self, budget: Budget, now_s: float) -> Budget:
        """The budget at `now_s`, refilled since its last state."""
        if self.regime == "fixed":
            same = self._window(now_s) <= self._window(budget.at_s)
            used = budget.used if same else 0.0
        else:
            rate = budget.limit / self.window_s
            used = max(0.0, budget.used - rate * max(0.0, now_s - budget.at_s))
        return dataclasses.replace(budget, used=used, at_s=max(now_s, budget.at_s))

    def until_full(self, budget: Budget) -> float:
        """Simulated seconds until the budget is whole (fixed: until the window ends)."""
        if self.regime == "fixed":
            return (self._window(budget.at_s) + 1) * self.window_s - budget.at_s
        return budget.used / (budget.limit / self.window_s)

    def until_fits(self, budget: Budget, cost: int) -> float:
        """Simulated seconds until the budget holds `cost` (until full if it never will)."""
        if budget.fits(cost):
            return 0.0
        if self.regime == "fixed" or cost > budget.limit:
            return self.until_full(budget)
        short = cost - (budget.limit - budget.used)
        return short / (budget.limit / self.window_s)

    def _window(self, t_s: float) -> int:
        return math.floor(t_s / self.window_s + _EPS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tally:
    """Requests served and refused, tokens billed (as generated) and refused (as charged)."""

    served: int = 0
    refused: int = 0
    billed_tokens: int = 0
    refused_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    allowed: bool
    headers: dict[str, str] = field(default_factory=dict)
    retry_after_s: float = 0.0  # real seconds
    message: str = ""


def parse_limits(body: object) -> dict[str, int | None]:
    """New limits from a JSON body such as `{"tpm": 500, "rpm": 3}`; null removes a budget."""
    if not isinstance(body, dict):
        raise ValueError('the body must be a JSON object such as {"tpm": 500}')
    unknown = sorted(set(body) - set(BUDGET_FLAGS))
    if unknown:
        raise ValueError(f"unknown budgets {unknown}; known: {', '.join(BUDGET_FLAGS)}")
    for flag, value in body.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{flag} must be a whole number or null")
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1 (null removes the budget)")
    return dict(body)


class RateLimiter:
    """The budgets of one simulated hosted API, and the tally of what it served."""

    def __init__(
        self,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        itpm: int | None = None,
        otpm: int | None = None,
        regime: Regime = "fixed",
        window_s: float = 60.0,
        time_scale: float = 1.0,
        headers: HeaderFamily = "openai",
    ) -> None:
        self.refill = Refill(regime=regime, window_s=window_s)
        self.time_scale = time_scale
        self.family: HeaderFamily = headers
        self._budgets: dict[str, Budget] = {}
        self.tally = Tally()
        self.set_limits(0.0, parse_limits({"rpm": rpm, "tpm": tpm, "itpm": itpm, "otpm": otpm}))

    @property
    def limits(self) -> dict[str, int | None]:
        """The current limit of each budget by its flag; None where there is none."""
        return {
            flag: b.limit if (b := self._budgets.get(name)) else None
            for flag, name in BUDGET_FLAGS.items()
        }

    def set_limits(self, now_s: float, changes: Mapping[str, int | None]) -> None:
        """New limits at once; a budget keeps what was used, at most its new limit."""
        budgets = {n: self.refill.advance(b, now_s) for n, b in self._budgets.items()}
        for flag, limit in changes.items():
            name = BUDGET_FLAGS[flag]
            old = budgets.pop(name, None)
            if limit is not None and old is None:
                budgets[name] = Budget(limit=limit, at_s=now_s)
            elif limit is not None and old is not None:
                budgets[name] = dataclasses.replace(old, limit=limit, used=min(old.used, limit))
        # In the order of BUDGET_FLAGS, so that headers and views keep one order.
        self._budgets = {n: budgets[n] for n in BUDGET_FLAGS.values() if n in budgets}

    def reset(self) -> None:
        """Whole budgets (the limits stay) and a zero tally."""
        self._budgets = {
            name: Budget(limit=b.limit, at_s=b.at_s) for name, b in self._budgets.items()
        }
        self.tally = Tally()

    def check(
        self, now_s: float, cost: Cost | None = None, *, tokens: int = 0, wall_s: float = 0.0
    ) -> Verdict:
        """Charge a request at simulated time `now_s`, or refuse it and say how long to wait.

        `tokens` without a `cost` is the short form of one request of that many input tokens.
        """
        cost = Cost(input_tokens=tokens) if cost is None else cost
        budgets = {n: self.refill.advance(b, now_s) for n, b in self._budgets.items()}
        short = [n for n, b in budgets.items() if not b.fits(cost.of(n))]
        if short:
            self._budgets = budgets
            self.tally = dataclasses.replace(
                self.tally,
                refused=self.tally.refused + 1,
                refused_tokens=self.tally.refused_tokens + cost.tokens,
            )
            wait = max(self.refill.until_fits(b, cost.of(n)) for n, b in budgets.items())
            wait /= self.time_scale
            first = budgets[short[0]]
            return Verdict(
                allowed=False,
                headers=render(self.family, self._views(budgets), wall_s),
                retry_after_s=wait,
                message=f"Rate limit reached for {short[0]}: limit {first.limit}, remaining "
                f"{first.remaining}, requested {cost.of(short[0])}. "
                f"Please try again in {format_duration(wait)}.",
            )
        self._budgets = {
            n: dataclasses.replace(b, used=b.used + cost.of(n)) for n, b in budgets.items()
        }
        self.tally = dataclasses.replace(self.tally, served=self.tally.served + 1)
        headers = render(self.family, self._views(self._budgets), wall_s)
        return Verdict(allowed=True, headers=headers)

    def bill(self, tokens: int) -> None:
        """Count the tokens a served request used, when its reply ends."""
        billed = self.tally.billed_tokens + tokens
        self.tally = dataclasses.replace(self.tally, billed_tokens=billed)

    def views(self, now_s: float) -> list[BudgetView]:
        """Each budget as of `now_s`: its limit, what remains, real seconds until it is full."""
        return self._views({n: self.refill.advance(b, now_s) for n, b in self._budgets.items()})

    def describe(self, now_s: float) -> dict[str, Any]:
        """The JSON of `GET /debug/limits`: limits, regime, each budget now, and the tally."""
        return {
            "regime": self.refill.regime,
            "window_s": self.refill.window_s,
            "headers": self.family,
            "time_scale": self.time_scale,
            "limits": self.limits,
            "budgets": {
                v.name: {"limit": v.limit, "remaining": v.remaining, "reset_s": v.reset_s}
                for v in self.views(now_s)
            },
            "counts": dataclasses.asdict(self.tally),
        }

    def _views(self, budgets: Mapping[str, Budget]) -> list[BudgetView]:
        return [
            BudgetView(
                name=name,
                limit=b.limit,
                remaining=b.remaining,
                reset_s=self.refill.until_full(b) / self.time_scale,
            )
            for name, b in budgets.items()
        ]
