"""A run's rest, projected before it runs: tokens, USD, seconds, rate-limit waits, and which
limit it meets first.

Pure module: no I/O, no clock, no randomness, no model calls; `Inputs` in, `Forecast` out.

Theory of operation. A *step* is one turn and, unless the turn is the run's answer, the tool
round after it. Without `steps` the projection runs to the end of the run's tool calls: one
step per round its calls left allow, then the answer (the turn with tool_choice none). Each
quantity is estimated from the run's own turns blended with what the runtime learned of its
model over all runs (`turn_samples.ModelStats`), as `turn_estimates` blends them:

    prompt      the last prompt plus a growth per round (own differences, else the model's,
                else the last reply and the last tool results' text at 4 characters a token)
    cached      a share of the prompt, as the engine's cache served it (0 when never seen)
    completion  by kind: a turn that calls tools, or the answer (never seen: `maxTokens`)
    seconds     a turn's, by kind; a tool round's (its slowest call); the waits of `rate_waits`

Spreads: a round's growth is the run's own, so its error adds up over the steps; completions
and seconds are taken as independent. `low`/`high` are mean -/+ one standard deviation.

A limit is met at the first step whose cumulative use passes it: every budget at or above the
run (its use now counts the whole subtree; the projection adds this run's turns only), the
context window (prompt plus `maxTokens` over it: the engine refuses the turn), and a window
no wait lets through (`rate_waits.Blocked`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from luftpause.runtime.core.price import Price
from luftpause.runtime.core.rate_waits import Demand, Playback, Window
from luftpause.runtime.core.turn_estimates import (
    Estimate,
    completion,
    estimate,
    first_seconds,
    seconds,
)
from luftpause.runtime.core.turn_samples import History, ModelStats

CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetLine:
    """A budget at or above the run: its limits and the subtree's use now."""

    run: str
    limits: Mapping[str, float]
    used: Mapping[str, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class Inputs:
    history: History
    prior: ModelStats = field(default_factory=ModelStats)
    max_tokens: int = 256
    calls_left: int = 0
    parallel: bool = False
    # Its tool calls are running now: the round ends before the next turn.
    in_round: bool = False
    steps: int | None = None
    price: Price | None = None
    context_window: int | None = None
    budgets: tuple[BudgetLine, ...] = ()
    windows: tuple[Window, ...] = ()
    # Without turns of its own: its messages' tokens (at CHARS_PER_TOKEN), and the text of
    # its last tool results, for the growth when nothing better is known.
    prompt_guess: int = 0
    results_tokens: int = 0

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise ValueError("steps must be at least 1")
        if self.calls_left < 0 or self.max_tokens < 0:
            raise ValueError("calls_left and max_tokens must be at least 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    number: int
    kind: str  # "call" or "answer"
    prompt: float
    cached: float
    completion: float
    calls: float
    turn_seconds: float
    tool_seconds: float
    wait_seconds: float
    usd: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Hit:
    which: str  # a budget kind, "context", or "rateLimit"
    at_step: int
    run: str | None = None
    window: str | None = None
    limit: float | None = None
    projected: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Forecast:
    steps: tuple[Step, ...]
    until: str  # "answer" or "steps"
    tokens_sd: float
    seconds_sd: float | None
    hits: tuple[Hit, ...]
    context_peak: float
    context_window: int | None
    sources: Mapping[str, str]
    notes: tuple[str, ...]

    @property
    def first(self) -> Hit | None:
        return min(self.hits, key=lambda h: h.at_step, default=None)


# --- estimates ---


@dataclass(frozen=True, slots=True, kw_only=True)
class _Estimates:
    start: Estimate  # the next turn's prompt
    growth: Estimate  # per round
    cache: float  # share of a prompt served from cache
    call: Estimate  # completion of a turn that calls tools
    answer: Estimate  # completion of the answer
    call_s: Estimate | None
    answer_s: Estimate | None
    first_s: Estimate | None  # the run's first turn, when it has taken none yet
    round_s: Estimate
    per_round: float  # calls per round


def _estimates(i: Inputs, notes: list[str]) -> _Estimates:
    h, p = i.history, i.prior
    turns = h.turns
    call = completion(h, p, answer=False, cap=i.max_tokens)
    diffs = [float(b.prompt - a.prompt) for a, b in itertools.pairwise(turns) if not b.fresh]
    growth = estimate(diffs, p.growth)
    if growth is not None and growth.mean < 0:  # a history only grows (compactions aside)
        growth = Estimate(mean=0.0, sd=growth.sd, source=growth.source)
    if growth is None:
        last = turns[-1].completion if turns else call.mean
        growth = Estimate(mean=float(last + i.results_tokens))
        notes.append("prompt growth per round assumed: the last reply plus the tool results' text")
    if turns:
        start = Estimate(mean=turns[-1].prompt + growth.mean, source="run")
    elif p.first_prompt.n:
        start = Estimate(mean=p.first_prompt.mean, sd=p.first_prompt.sd, source="model")
    else:
        start = Estimate(mean=float(i.prompt_guess), source="text")
        notes.append(
            f"no turn seen: the first prompt is its text at {CHARS_PER_TOKEN} chars a token"
        )
    cache = estimate([t.cached / t.prompt for t in turns[1:] if t.prompt], p.cache_ratio)
    if cache is None and i.price is not None:
        notes.append("no cached prompt seen: every prompt token priced as input")
    round_s = estimate([r.seconds for r in h.rounds], p.round_seconds)
    if round_s is None and (i.calls_left or i.in_round):
        notes.append("no tool round seen: tool rounds counted as 0 s")
    per_round = 1.0
    if i.parallel:
        calls = estimate([float(r.calls) for r in h.rounds], p.calls_per_round)
        per_round = 1.0 if calls is None else max(1.0, calls.mean)
    call_s = seconds(h, p, answer=False)
    if call_s is None:
        notes.append("no turn of this model seen: seconds unknown")
    return _Estimates(
        start=start,
        growth=growth,
        cache=0.0 if cache is None else min(max(cache.mean, 0.0), 1.0),
        call=call,
        answer=completion(h, p, answer=True, cap=i.max_tokens),
        call_s=call_s,
        answer_s=seconds(h, p, answer=True),
        first_s=None if turns else first_seconds(h, p),
        round_s=round_s or Estimate(mean=0.0),
        per_round=per_round,
    )


# --- projection ---


def project(i: Inputs) -> Forecast:
    """The forecast of the steps ahead (see the module docstring)."""
    notes: list[str] = []
    e = _estimates(i, notes)
    rounds_left = math.ceil(i.calls_left / e.per_round) if i.calls_left else 0
    horizon = rounds_left + 1
    count = horizon if i.steps is None else min(i.steps, horizon)
    if e.answer.source == "maxTokens" and count > rounds_left:
        notes.append("no answer of this model seen: the answer counted at maxTokens")
    playback = Playback(i.windows)
    steps = _walk(i, e, rounds_left, count, playback)
    return Forecast(
        steps=tuple(steps),
        until="answer" if count == horizon else "steps",
        tokens_sd=_tokens_sd(e, steps, bool(i.history.turns)),
        seconds_sd=_seconds_sd(e, steps),
        hits=tuple(_hits(i, steps, playback)),
        context_peak=max((x.prompt + x.completion for x in steps), default=0.0),
        context_window=i.context_window,
        sources={
            "prompt": e.start.source,
            "growth": e.growth.source,
            "callCompletion": e.call.source,
            "answerCompletion": e.answer.source,
            "callSeconds": "unknown" if e.call_s is None else e.call_s.source,
            "answerSeconds": "unknown" if e.answer_s is None else e.answer_s.source,
            "toolSeconds": e.round_s.source,
        },
        notes=tuple(notes),
    )


def _walk(i: Inputs, e: _Estimates, rounds_left: int, count: int, playback: Playback) -> list[Step]:
    """Each step in order, the windows played along (a round in progress ends first)."""
    steps: list[Step] = []
    t = e.round_s.mean if i.in_round else 0.0
    calls_done = 0.0
    for k in range(1, count + 1):
        kind = "call" if k <= rounds_left else "answer"
        prompt = e.start.mean + (k - 1) * e.growth.mean
        done = (e.call if kind == "call" else e.answer).mean
        turn = _turn_s(e, kind, k)
        calls = min(e.per_round, i.calls_left - calls_done) if kind == "call" else 0.0
        calls_done += calls
        tools = e.round_s.mean if kind == "call" else 0.0
        if k == 1 and i.in_round:
            tools += e.round_s.mean
        wait = playback.take(k, Demand(prompt=prompt, completion=done), t)
        t += wait + (0.0 if turn is None else turn.mean) + tools
        cached = e.cache * prompt
        cost = None
        if i.price is not None:
            cost = i.price.cost(prompt=prompt, cached=cached, completion=done)
        steps.append(
            Step(
                number=k,
                kind=kind,
                prompt=prompt,
                cached=cached,
                completion=done,
                calls=calls,
                turn_seconds=0.0 if turn is None else turn.mean,
                tool_seconds=tools,
                wait_seconds=wait,
                usd=cost,
            )
        )
    return steps


def _turn_s(e: _Estimates, kind: str, step: int) -> Estimate | None:
    if step == 1 and e.first_s is not None:
        return e.first_s
    return e.call_s if kind == "call" else e.answer_s


def _tokens_sd(e: _Estimates, steps: Sequence[Step], seen: bool) -> float:
    """The growth's error adds up over the steps (it is the run's own); replies' do not."""
    prompt = sum(e.start.sd + e.growth.sd * (x.number - (0 if seen else 1)) for x in steps)
    replies = math.sqrt(sum((e.call if x.kind == "call" else e.answer).sd ** 2 for x in steps))
    return math.hypot(prompt, replies)


def _seconds_sd(e: _Estimates, steps: Sequence[Step]) -> float | None:
    if e.call_s is None:
        return None
    var = 0.0
    for x in steps:
        turn = _turn_s(e, x.kind, x.number) or e.call_s
        var += turn.sd**2 + (e.round_s.sd**2 if x.kind == "call" else 0.0)
    return math.sqrt(var)


def _hits(i: Inputs, steps: Sequence[Step], playback: Playback) -> list[Hit]:
    """The first step at which each limit is passed."""
    cum: list[dict[str, float]] = []
    acc = {"tokens": 0.0, "toolCalls": 0.0, "seconds": 0.0, "usd": 0.0}
    for x in steps:
        acc = {
            "tokens": acc["tokens"] + x.prompt + x.completion,
            "toolCalls": acc["toolCalls"] + x.calls,
            "seconds": acc["seconds"] + x.turn_seconds + x.tool_seconds + x.wait_seconds,
            "usd": acc["usd"] + (x.usd or 0.0),
        }
        cum.append(acc)
    hits = []
    for line in i.budgets:
        for which, limit in line.limits.items():
            if which not in line.used:
                continue
            at = next(
                (
                    (x, line.used[which] + c[which])
                    for x, c in zip(steps, cum, strict=True)
                    if line.used[which] + c[which] > limit
                ),
                None,
            )
            if at is not None:
                step, projected = at
                hits.append(
                    Hit(
                        which=which,
                        at_step=step.number,
                        run=line.run,
                        limit=limit,
                        projected=projected,
                    )
                )
    if i.context_window is not None:
        over = next((x for x in steps if x.prompt + i.max_tokens > i.context_window), None)
        if over is not None:
            hits.append(
                Hit(
                    which="context",
                    at_step=over.number,
                    limit=i.context_window,
                    projected=over.prompt + i.max_tokens,
                )
            )
    if playback.blocked is not None:
        b = playback.blocked
        hits.append(Hit(which="rateLimit", at_step=b.at_step, window=f"{b.window} {b.dimension}"))
    return hits
