"""What the fake MCP tools say, how long they take, and how often they were called (per tool,
and per idempotency key: requests received, executions, the result a repeat is answered with).

Pure module: no I/O, no clock reads, no awaits. Randomness arrives as a `random.Random` the
caller seeded; filler text is a function of the query alone, so two runs of a test see the
same words.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TOOL_NAMES = ("lookup", "deep_search", "delete_record", "charge", "set_status")

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


def charge_text(account: str, cents: int, receipt: int) -> str:
    """What `charge` returns: the receipt of one execution."""
    return f"charged {cents} cents to {account}: receipt {receipt}"


def status_text(ticket: str, status: str) -> str:
    """What `set_status` returns."""
    return f"ticket {ticket} is now {status}"


@dataclass(slots=True)
class KeyCount:
    """One idempotency key: requests that carried it, executions begun for it, and the result of
    the execution that finished (None until one did)."""

    tool: str
    received: int = 0
    executions: int = 0
    result: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "received": self.received,
            "executions": self.executions,
            "answered": self.result is not None,
        }


class KeyLedger:
    """Every idempotency key seen, from the ledger's records (`feed`, in the order written):

        {"event": "received", "key": K, "tool": T}    a request carried K
        {"event": "started",  "key": K, "tool": T}    an execution for K began
        {"event": "finished", "key": K, "tool": T, "result": TEXT}

    A request whose key has a finished execution is answered with its result and not executed;
    an execution begun but never finished (the server died) leaves the key unanswered, so the
    next request for it executes again.
    """

    def __init__(self) -> None:
        self.keys: dict[str, KeyCount] = {}

    def feed(self, record: Mapping[str, Any]) -> None:
        key, event = str(record["key"]), record["event"]
        entry = self.keys.setdefault(key, KeyCount(tool=str(record.get("tool", ""))))
        if event == "received":
            entry.received += 1
        elif event == "started":
            entry.executions += 1
        elif event == "finished":
            entry.result = str(record["result"])
        else:
            raise ValueError(f"unknown ledger event {event!r}")

    def answer(self, key: str) -> str | None:
        """The result a request for `key` gets without executing, if any."""
        entry = self.keys.get(key)
        return None if entry is None else entry.result

    def executions(self, tool: str) -> int:
        """Executions begun for keyed requests of `tool` (receipts are numbered by it)."""
        return sum(e.executions for e in self.keys.values() if e.tool == tool)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {k: e.to_json() for k, e in self.keys.items()}
