"""What the fake MCP tools say, how long they take, and how often they were called.

Pure module: no I/O, no clock reads, no awaits. Randomness arrives as a `random.Random` the
caller seeded; filler text is a function of the query alone, so two runs of a test see the
same words.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

TOOL_NAMES = ("lookup", "deep_search", "delete_record")

_SUBJECTS = (
    "The archive",
    "A field report",
    "The maintainers' notes",
    "An older survey",
    "The index",
    "A cross-reference",
    "The changelog",
    "A reviewer",
)
_VERBS = ("mentions", "links", "summarises", "contradicts", "confirms", "dates", "qualifies")
_OBJECTS = (
    "two related entries from the same quarter.",
    "a figure that later sources revise upward.",
    "an earlier draft with a different conclusion.",
    "the usual caveats about sample size.",
    "a footnote nobody has followed up.",
    "three competing definitions.",
    "a measurement taken under load.",
)


def _sentence(rng: random.Random) -> str:
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"


def filler_text(query: str, *, sentences: int) -> str:
    """A few deterministic sentences about `query`; the first names it."""
    if sentences < 1:
        raise ValueError(f"sentences must be at least 1, got {sentences}")
    # A str seed is hashed with SHA-512, so the text is stable across processes and runs.
    rng = random.Random(f"filler:{query}")
    lines = [f"Results for {query!r}: {_sentence(rng)}"]
    lines += [_sentence(rng) for _ in range(sentences - 1)]
    return " ".join(lines)


def lookup_text(query: str) -> str:
    """What `lookup` returns: three sentences."""
    return filler_text(query, sentences=3)


def deep_search_text(query: str, depth: int) -> str:
    """What `deep_search` returns: one paragraph of five sentences per level of depth."""
    paragraphs = [
        f"[depth {level}] " + filler_text(f"{query}#{level}", sentences=5)
        for level in range(1, depth + 1)
    ]
    return f"Deep search for {query!r}.\n\n" + "\n\n".join(paragraphs)


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """A tool's latency: uniform in [low, high] seconds, fixed when low == high."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ValueError(f"latency needs 0 <= low <= high, got {self.low}..{self.high}")

    @classmethod
    def fixed(cls, seconds: float) -> Latency:
        return cls(low=seconds, high=seconds)

    def draw(self, rng: random.Random, *, time_scale: float = 1.0) -> float:
        """One latency in seconds, divided by `time_scale`."""
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        seconds = self.low if self.low == self.high else rng.uniform(self.low, self.high)
        return seconds / time_scale


@dataclass(slots=True)
class CallStats:
    """Calls started and calls in flight, per tool."""

    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOOL_NAMES, 0))
    in_flight: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOOL_NAMES, 0))

    def started(self, tool: str) -> None:
        self.calls[tool] = self.calls.get(tool, 0) + 1
        self.in_flight[tool] = self.in_flight.get(tool, 0) + 1

    def finished(self, tool: str) -> None:
        self.in_flight[tool] -= 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """The `/stats` body: copies, so a caller cannot change the counts."""
        return {"calls": dict(self.calls), "in_flight": dict(self.in_flight)}
