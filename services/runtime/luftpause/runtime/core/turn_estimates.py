"""One quantity of a run's next turns, from the run's own samples and its model's.

Pure module: no I/O. The model's samples (`turn_samples.ModelStats`, over all runs) count as
`PRIOR_WEIGHT` of the run's own: a run's own turns say most about its task, the model's say
something before it has any. A turn is of one of two kinds, a turn that calls tools or the
run's answer, whose replies differ (a call is short; an answer is what the run was for).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from luftpause.runtime.core.turn_samples import History, ModelStats, Spread, TurnSample

PRIOR_WEIGHT = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """A quantity per step: mean, spread, and where it came from (run, model, run+model, ...)."""

    mean: float
    sd: float = 0.0
    source: str = "assumed"


def blend(own: Sequence[float], prior: Spread, weight: float = PRIOR_WEIGHT) -> Spread | None:
    """The run's own samples with the model's, the model's counting as `weight` samples."""
    mine = Spread.of(own)
    if mine.n == 0:
        return prior if prior.n else None
    if prior.n == 0:
        return mine
    w = min(weight, float(prior.n))
    n = mine.n + w
    mean = (mine.mean * mine.n + prior.mean * w) / n
    var = (
        mine.n * (mine.sd**2 + (mine.mean - mean) ** 2)
        + w * (prior.sd**2 + (prior.mean - mean) ** 2)
    ) / n
    return Spread(n=mine.n + prior.n, mean=mean, sd=math.sqrt(var))


def estimate(own: Sequence[float], prior: Spread) -> Estimate | None:
    """`blend` with its source; None when neither the run nor the model has a sample."""
    found = blend(own, prior)
    if found is None:
        return None
    source = "run+model" if own and prior.n else "run" if own else "model"
    return Estimate(mean=found.mean, sd=found.sd, source=source)


def _by_kind(turns: Sequence[TurnSample], answer: bool, attr: str) -> list[float]:
    return [float(getattr(t, attr)) for t in turns if t.answer == answer]


def seconds(history: History, prior: ModelStats, *, answer: bool) -> Estimate | None:
    """A later turn's seconds (the answer's when `answer`), else the other kind's, else a first
    turn's; None if unknown. A run's first turn reads its whole prompt, the later ones mostly
    their cache, so the first counts only when nothing else is known."""
    later = history.turns[1:]
    mine, other = (
        (prior.answer_seconds, prior.call_seconds)
        if answer
        else (prior.call_seconds, prior.answer_seconds)
    )
    found = estimate(_by_kind(later, answer, "seconds"), mine)
    if found is not None:
        return found
    found = estimate(_by_kind(later, not answer, "seconds"), other)
    if found is not None:
        return Estimate(mean=found.mean, sd=found.sd, source="other kind")
    return _relabel(first_seconds(history, prior), "first turn")


def first_seconds(history: History, prior: ModelStats) -> Estimate | None:
    """A run's first turn's seconds: its own, else its model's first turns'."""
    return estimate([t.seconds for t in history.turns[:1]], prior.first_seconds)


def _relabel(found: Estimate | None, source: str) -> Estimate | None:
    return None if found is None else Estimate(mean=found.mean, sd=found.sd, source=source)


def turn_seconds(history: History, prior: ModelStats, *, answer: bool) -> float | None:
    """The next turn's expected seconds (its first, for a run without a turn yet); None when no
    turn of the model was ever seen."""
    found = (
        seconds(history, prior, answer=answer)
        if history.turns
        else first_seconds(history, prior) or seconds(history, prior, answer=answer)
    )
    return None if found is None else found.mean


def completion(history: History, prior: ModelStats, *, answer: bool, cap: int) -> Estimate:
    """A turn's completion tokens by kind; `cap` (maxTokens) when never seen."""
    spread = prior.answer_completion if answer else prior.call_completion
    found = estimate(_by_kind(history.turns, answer, "completion"), spread)
    if found is None:
        return Estimate(mean=float(cap), source="maxTokens")
    mean = min(found.mean, float(cap)) if cap else found.mean
    return Estimate(mean=mean, sd=found.sd, source=found.source)
