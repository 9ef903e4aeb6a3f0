"""What the runtime learned from its journal: each live run's turns and tool rounds, and per
model the spread of a turn's tokens and seconds over all runs.

Pure module: no I/O, no clock; an in-memory fold of journal records (`feed`), the same records
the runtime appends and replays (`journal`), so a restarted runtime knows what it knew. From
the records it reads:

    spawned, forked   the run's model and price (its spec)
    batch             the records inside, in order
    round             one turn that made tool calls (usage, turnSeconds) and its round (the
                      slowest call's seconds: the calls of a round run together)
    finished          the run's last turn, its answer (when it finished with one); the run's
                      own history is then dropped, what it taught the model stays
    compacted         the summary call's cost; the next turn's prompt does not continue the
                      last one's (the history shrank), so it teaches no growth

A `turn` record (a turn waiting for approval) is skipped: its round record repeats its usage.
Per model it keeps the last `WINDOW` samples of each quantity, so what it knows follows the
engine and the workload as they change, and states them as mean and spread (`Spread`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from luftpause.runtime.core.price import Price

WINDOW = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    """Mean and standard deviation of `n` samples (n = 0: nothing known)."""

    n: int = 0
    mean: float = 0.0
    sd: float = 0.0

    @classmethod
    def of(cls, xs: Iterable[float]) -> Spread:
        values = list(xs)
        if not values:
            return cls()
        mean = math.fsum(values) / len(values)
        var = math.fsum((x - mean) ** 2 for x in values) / len(values)
        return cls(n=len(values), mean=mean, sd=math.sqrt(var))


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnSample:
    """One turn: its tokens and seconds, and whether it was the run's answer."""

    prompt: int
    cached: int
    completion: int
    seconds: float
    answer: bool = False
    # Its prompt does not continue the previous turn's (a compaction came between).
    fresh: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundSample:
    """One tool round: how many calls, and how long the slowest took."""

    calls: int
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    """One run's own turns and tool rounds, oldest first."""

    turns: tuple[TurnSample, ...] = ()
    rounds: tuple[RoundSample, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStats:
    """A model's turns over all runs (the recent `WINDOW` of each quantity)."""

    first_prompt: Spread = field(default_factory=Spread)
    growth: Spread = field(default_factory=Spread)
    cache_ratio: Spread = field(default_factory=Spread)
    call_completion: Spread = field(default_factory=Spread)
    answer_completion: Spread = field(default_factory=Spread)
    # A run's first turn (it reads its whole prompt), and the later ones by kind.
    first_seconds: Spread = field(default_factory=Spread)
    call_seconds: Spread = field(default_factory=Spread)
    answer_seconds: Spread = field(default_factory=Spread)
    round_seconds: Spread = field(default_factory=Spread)
    calls_per_round: Spread = field(default_factory=Spread)

    @property
    def turns(self) -> int:
        return self.first_seconds.n + self.call_seconds.n + self.answer_seconds.n


_QUANTITIES = tuple(ModelStats.__dataclass_fields__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Spent:
    """What one record's turn cost, for the spend counter."""

    model: str
    usd: float


class Ledger:
    """Journal records in, run histories and model statistics out."""

    def __init__(self, window: int = WINDOW) -> None:
        self._window = window
        self._models: dict[str, dict[str, deque[float]]] = {}
        self._runs: dict[str, tuple[str, Price | None]] = {}
        self._histories: dict[str, History] = {}
        self._compacted: set[str] = set()
        # A model's statistics as last computed, until a sample of it is added (`_samples`).
        self._stats: dict[str, ModelStats] = {}

    def feed(self, record: Mapping[str, Any]) -> list[Spent]:
        """Learn from one record; what the turns it adds cost (runs with a price only)."""
        kind = record.get("type")
        if kind == "batch":
            return [s for r in record.get("records") or () for s in self.feed(r)]
        handle = str(record.get("run"))
        if kind in ("spawned", "forked"):
            self._begin(handle, record.get("spec") or {})
            return []
        if handle not in self._runs:
            return []
        if kind == "round":
            results = record.get("results") or []
            seconds = max((float(r.get("seconds", 0.0)) for r in results), default=0.0)
            spent = self._turn(handle, record.get("usage"), answer=False)
            self._round(handle, RoundSample(calls=len(results), seconds=seconds))
            return spent
        if kind == "finished":
            spent = []
            if record.get("state") == "finished":
                spent = self._turn(handle, record.get("usage"), answer=True)
            self._histories.pop(handle, None)
            self._runs.pop(handle, None)
            self._compacted.discard(handle)
            return spent
        if kind == "compacted":
            self._compacted.add(handle)
            return self._cost(handle, _usage(record.get("usage")))
        return []

    def history(self, handle: str) -> History:
        return self._histories.get(handle, History())

    def stats(self, model: str) -> ModelStats:
        known = self._stats.get(model)
        if known is not None:
            return known
        samples = self._models.get(model)
        if samples is None:
            return ModelStats()
        known = self._stats[model] = ModelStats(**{q: Spread.of(samples[q]) for q in _QUANTITIES})
        return known

    # --- folding ---

    def _begin(self, handle: str, spec: Mapping[str, Any]) -> None:
        raw = spec.get("price")
        price = None
        if isinstance(raw, Mapping):
            try:
                price = Price.from_json(dict(raw))
            except (KeyError, TypeError, ValueError):
                price = None
        self._runs[handle] = (str(spec.get("model", "")), price)
        self._histories[handle] = History()

    def _samples(self, model: str) -> dict[str, deque[float]]:
        """The model's samples, to add to: its statistics are computed again when next asked."""
        self._stats.pop(model, None)
        if model not in self._models:
            self._models[model] = {q: deque(maxlen=self._window) for q in _QUANTITIES}
        return self._models[model]

    def _turn(self, handle: str, raw: Any, *, answer: bool) -> list[Spent]:
        usage = _usage(raw)
        if usage is None:
            return []
        turn = TurnSample(**usage, answer=answer, fresh=handle in self._compacted)
        self._compacted.discard(handle)
        model, _ = self._runs[handle]
        history = self.history(handle)
        samples = self._samples(model)
        if history.turns:
            if not turn.fresh:
                samples["growth"].append(turn.prompt - history.turns[-1].prompt)
            if turn.prompt:
                samples["cache_ratio"].append(turn.cached / turn.prompt)
        else:
            samples["first_prompt"].append(turn.prompt)
        kind = "answer" if answer else "call"
        samples[f"{kind}_completion"].append(turn.completion)
        samples[f"{kind}_seconds" if history.turns else "first_seconds"].append(turn.seconds)
        if handle in self._histories:
            self._histories[handle] = History(turns=(*history.turns, turn), rounds=history.rounds)
        return self._cost(handle, usage)

    def _cost(self, handle: str, usage: Mapping[str, Any] | None) -> list[Spent]:
        model, price = self._runs[handle]
        if price is None or usage is None:
            return []
        cost = price.cost(
            prompt=usage["prompt"], cached=usage["cached"], completion=usage["completion"]
        )
        return [Spent(model=model, usd=cost)]

    def _round(self, handle: str, sample: RoundSample) -> None:
        model, _ = self._runs[handle]
        samples = self._samples(model)
        samples["round_seconds"].append(sample.seconds)
        samples["calls_per_round"].append(sample.calls)
        history = self.history(handle)
        if handle in self._histories:
            self._histories[handle] = History(turns=history.turns, rounds=(*history.rounds, sample))


def _usage(raw: Any) -> dict[str, Any] | None:
    """A record's usage of one turn or more (None: no turn), as TurnSample's fields."""
    if not isinstance(raw, Mapping) or int(raw.get("turns", 0)) < 1:
        return None
    return {
        "prompt": int(raw.get("promptTokens", 0)),
        "cached": int(raw.get("cachedPromptTokens", 0)),
        "completion": int(raw.get("completionTokens", 0)),
        "seconds": float(raw.get("turnSeconds", 0.0)),
    }
