"""What the scheduler learns from reported turns: sizes, speeds and how runs come back.

Pure module: frozen values and functions that return updated ones; no I/O, no clock. Every
figure is a running mean that weights recent turns more (an exponential moving average with
weight ALPHA), so it follows a workload that changes:

- `Sizes`: prompt tokens per request byte (to size a new run's first turn from its body before
  any usage is reported), completion tokens per turn, what a run's next prompt adds to its
  context between turns (a tool result, a user message), and a new run's first footprint;
- `Comeback`, per service class and way a turn ended (with tool calls or without), over all runs
  and per number of rounds a run had finished: how often the run's next turn comes, and how long
  after (mean and variance). A run whose turns mostly come
  back is kept resident until nearly all of them would have (`window`); one that rarely comes
  back is not kept at all: a finished run that looks like a paused one holds its replica's KV
  for its window, so a tight window is what keeps that cheap;
- `PrefillFit`, per replica: a least-squares line of time to first token against uncached
  prompt tokens, whose slope is what reading one token of context costs there (the price of
  moving a run away from its cached prefix).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

ALPHA = 0.1
"""Weight of the newest sample in a running mean."""

COMES_BACK = 0.25
"""A way of ending after which fewer runs than this come back keeps no run resident."""

WINDOW_SPREAD = 3.0
WINDOW_GAPS = 1.25
WINDOW_SLACK_S = 0.1
"""A run expected back stays resident for its kind's mean gap plus WINDOW_SPREAD deviations, at
least WINDOW_GAPS mean gaps, and WINDOW_SLACK_S more (for reports still on their way)."""

WINDOW_MAX_S = 600.0
TOOL_WINDOW_DEFAULT_S = 60.0
"""Residency of a run paused on a tool before any run of its class has come back from one."""

_MIN_SAMPLES = 3.0
RECENT_REPLIES = 32
"""How many of the last replies the peak is the longest of (`Replies`)."""


def ewma(mean: float, sample: float, seen: float) -> float:
    """`mean` moved towards `sample`; the first sample (`seen` == 0) is taken as it is."""
    return sample if seen <= 0 else mean + ALPHA * (sample - mean)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizes:
    """Token sizes learned from usage, over all runs of the pool."""

    tokens_per_byte: float = 0.25
    reply_tokens: float = 0.0
    growth_tokens: float = 0.0
    new_run_tokens: float = 0.0
    turns_seen: float = 0.0
    returns_seen: float = 0.0
    new_runs_seen: float = 0.0

    def turn(self, *, prompt_bytes: int, prompt_tokens: int, completion_tokens: int) -> Sizes:
        """A finished turn's usage."""
        per_byte = self.tokens_per_byte
        if prompt_bytes > 0 and prompt_tokens > 0:
            per_byte = ewma(per_byte, prompt_tokens / prompt_bytes, self.turns_seen)
        return Sizes(
            tokens_per_byte=per_byte,
            reply_tokens=ewma(self.reply_tokens, completion_tokens, self.turns_seen),
            growth_tokens=self.growth_tokens,
            new_run_tokens=self.new_run_tokens,
            turns_seen=self.turns_seen + 1,
            returns_seen=self.returns_seen,
            new_runs_seen=self.new_runs_seen,
        )

    def growth(self, added: int) -> Sizes:
        """A run came back with `added` tokens more than its context had."""
        return Sizes(
            tokens_per_byte=self.tokens_per_byte,
            reply_tokens=self.reply_tokens,
            growth_tokens=ewma(self.growth_tokens, max(added, 0), self.returns_seen),
            new_run_tokens=self.new_run_tokens,
            turns_seen=self.turns_seen,
            returns_seen=self.returns_seen + 1,
            new_runs_seen=self.new_runs_seen,
        )

    def new_run(self, footprint: int) -> Sizes:
        """A new run's first turn ended with this footprint."""
        return Sizes(
            tokens_per_byte=self.tokens_per_byte,
            reply_tokens=self.reply_tokens,
            growth_tokens=self.growth_tokens,
            new_run_tokens=ewma(self.new_run_tokens, footprint, self.new_runs_seen),
            turns_seen=self.turns_seen,
            returns_seen=self.returns_seen,
            new_runs_seen=self.new_runs_seen + 1,
        )

    def prompt_estimate(self, prompt_bytes: int) -> int:
        """Prompt tokens of a request of `prompt_bytes` bytes."""
        return round(prompt_bytes * self.tokens_per_byte)

    def first_footprint(self, prompt_bytes: int) -> int:
        """A new run's footprint before its usage is known: its request, and a next round."""
        return max(self.prompt_estimate(prompt_bytes) + self.next_round, 1)

    @property
    def next_round(self) -> int:
        """What a resident run is expected to add before and in its next turn."""
        return round(self.growth_tokens + self.reply_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class Comeback:
    """How runs come back after one way of ending a turn."""

    ends: float = 0.0  # turns that ended this way, recent ones weighted more
    back: float = 0.0  # of those, runs that came back (same weights)
    gap_s: float = 0.0  # mean time until they did
    gap_var: float = 0.0  # and its variance

    def ended(self) -> Comeback:
        decay = 1.0 - ALPHA
        return Comeback(
            ends=self.ends * decay + 1.0,
            back=self.back * decay,
            gap_s=self.gap_s,
            gap_var=self.gap_var,
        )

    def returned(self, gap_s: float) -> Comeback:
        gap = max(gap_s, 0.0)
        mean = ewma(self.gap_s, gap, self.back)
        var = 0.0
        if self.back > 0:  # the exponentially weighted variance (West's update)
            var = (1 - ALPHA) * (self.gap_var + ALPHA * (gap - self.gap_s) ** 2)
        return Comeback(
            ends=self.ends, back=min(self.back + 1.0, self.ends), gap_s=mean, gap_var=var
        )

    def window(self, *, tool_calls: bool) -> float:
        """How long a run that ended this way stays resident (0: not at all): past the mean gap
        by WINDOW_SPREAD deviations and a little, so few runs that come back find it over."""
        if self.ends < _MIN_SAMPLES or self.back < 1.0:
            return TOOL_WINDOW_DEFAULT_S if tool_calls else 0.0
        if self.back / self.ends < COMES_BACK:
            return 0.0
        spread = WINDOW_SPREAD * math.sqrt(self.gap_var)
        window = max(self.gap_s + spread, WINDOW_GAPS * self.gap_s) + WINDOW_SLACK_S
        return min(window, WINDOW_MAX_S)


ROUNDS_CAP = 16
"""Runs are told apart by the rounds they finished up to this many (more count as this many)."""

ComebackKey = tuple[str, bool, int]
"""(service class, the turn ended with tool calls, rounds the run finished; -1 for any)."""


def comeback_keys(cls: str, tool_calls: bool, rounds: int) -> tuple[ComebackKey, ComebackKey]:
    """The key of every run that ended this way, and that of runs with as many rounds."""
    return (cls, tool_calls, -1), (cls, tool_calls, min(max(rounds, 0), ROUNDS_CAP))


_NEVER = Comeback()


def ended(comeback: Comeback | None) -> Comeback:
    """`comeback` (or none yet) once one more turn ended its way."""
    return (comeback or _NEVER).ended()


def returned(comeback: Comeback | None, gap_s: float) -> Comeback:
    """`comeback` (or none yet) once a run that ended its way came back after `gap_s`."""
    return (comeback or _NEVER).returned(gap_s)


def window_for(
    comebacks: Mapping[ComebackKey, Comeback], cls: str, tool_calls: bool, rounds: int
) -> float:
    """How long a run stays resident after its `rounds`-th turn ended this way: from runs that
    ended the same round when enough did (a run whose turns all end alike, a text tool protocol,
    still stops coming back after the round its kind usually ends on), else from all of them."""
    every, same = comeback_keys(cls, tool_calls, rounds)
    mine = comebacks.get(same)
    if mine is not None and mine.ends >= _MIN_SAMPLES:
        return mine.window(tool_calls=tool_calls)
    return comebacks.get(every, Comeback()).window(tool_calls=tool_calls)


# The key of every way of ending a turn, over all rounds (`comeback_keys`): class, tool calls.
_EVERY_ROUND: tuple[ComebackKey, ...] = tuple(
    (cls, tool_calls, -1) for cls in ("interactive", "batch") for tool_calls in (True, False)
)


def pause_s(comebacks: Mapping[ComebackKey, Comeback]) -> float | None:
    """How long a paused run is away at the least: the shortest mean gap of the ways of ending
    a turn (per class, with tool calls or not) that runs come back from; None while none is
    known. A context pushed out of a pool is read again when its run comes back, no sooner.
    Four lookups: it runs as every turn ends."""
    gaps = [
        c.gap_s
        for c in map(comebacks.get, _EVERY_ROUND)
        if c is not None and c.ends >= _MIN_SAMPLES and c.back >= max(1.0, COMES_BACK * c.ends)
    ]
    return min(gaps) if gaps else None


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillFit:
    """Time to first token against uncached prompt tokens on one replica (running sums)."""

    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def add(self, uncached: int, ttft_s: float) -> PrefillFit:
        d = 1.0 - ALPHA / 2
        x, y = float(uncached), max(ttft_s, 0.0)
        return PrefillFit(
            n=self.n * d + 1.0,
            sx=self.sx * d + x,
            sy=self.sy * d + y,
            sxx=self.sxx * d + x * x,
            sxy=self.sxy * d + x * y,
        )

    @property
    def s_per_token(self) -> float | None:
        """The fitted slope (seconds per uncached token); None until the samples spread."""
        if self.n < _MIN_SAMPLES:
            return None
        spread = self.n * self.sxx - self.sx * self.sx
        if spread <= 1e-9 * max(self.n * self.sxx, 1.0):
            return None
        return max((self.n * self.sxy - self.sx * self.sy) / spread, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Replies:
    """Completion tokens of finished turns (of one model and caller): a running mean and
    variance, so a reply is predicted as mean + k sigma (`gate`), and the last RECENT_REPLIES
    replies, whose longest is the `peak`."""

    n: float = 0.0
    mean: float = 0.0
    var: float = 0.0
    recent: tuple[float, ...] = ()

    def add(self, tokens: float) -> Replies:
        x = float(max(tokens, 0))
        mean = ewma(self.mean, x, self.n)
        var = (1 - ALPHA) * (self.var + ALPHA * (x - self.mean) ** 2) if self.n > 0 else 0.0
        recent = (*self.recent[1 - RECENT_REPLIES :], x)
        return Replies(n=self.n + 1, mean=mean, var=var, recent=recent)

    @property
    def peak(self) -> float:
        return max(self.recent, default=0.0)

    def predict(self, k: float) -> float | None:
        """mean + k sigma; None before MIN_SAMPLES replies."""
        if self.n < _MIN_SAMPLES:
            return None
        return self.mean + k * math.sqrt(self.var)

    def bound(self, k: float, prior: float) -> float:
        """What a provider's window reserves for a reply: the largest of mean + k sigma, the
        peak, and `prior` faded by (1 - ALPHA) a reply. Replies are not normal (an agent's
        tool calls are short, its answers long): mean + k sigma of a mix of both falls short
        of every long one, and an agent's first turns are its short ones, so the prior stays
        until a few dozen replies have been seen."""
        seen = self.predict(k) or 0.0
        return max(seen, self.peak, prior * (1 - ALPHA) ** self.n)
