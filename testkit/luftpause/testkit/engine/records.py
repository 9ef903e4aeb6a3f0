"""Values the engine core takes and gives: submissions, iteration records, statistics.

Pure module: frozen records (a submission checks its input when built); no behaviour beyond
derived numbers. `core` runs the engine on them; `driver`, `server` and `metrics` read them.
"""

from __future__ import annotations

from dataclasses import dataclass


class RequestTooLarge(ValueError):
    """The request could never fit in the KV pool, even alone."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    """A request as the engine sees it: token counts and what to cache when done."""

    rid: str
    prompt: tuple[int, ...]
    reserve: int
    output_tokens: int
    history: tuple[int, ...] = ()
    priority: int = 0
    # Token indices where the prompt's parts (tools, messages) end, and the history's (the
    # prompt's and the reply's own): where a message-granular prefix cache cuts.
    prompt_cuts: tuple[int, ...] = ()
    history_cuts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("a prompt has at least one token")
        if not 0 <= self.output_tokens <= self.reserve:
            raise ValueError("output_tokens must be within 0..reserve")


@dataclass(frozen=True, slots=True, kw_only=True)
class Admitted:
    """A request that started in an iteration, and how much of its prompt was cached."""

    rid: str
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One engine iteration: what it started with and what it produced at its end."""

    at: float
    duration_ms: float
    prefill_tokens: int
    batch: int
    admitted: tuple[Admitted, ...]
    emitted: tuple[str, ...]
    finished: tuple[str, ...]
    retracted: tuple[str, ...] = ()

    @property
    def ends_at(self) -> float:
        return self.at + self.duration_ms


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStats:
    """A snapshot of the engine for `/metrics`: queue, batch, KV pool (in blocks), counters."""

    running: int
    waiting: int
    total_blocks: int
    used_blocks: int
    cached_blocks: int
    admitted_total: int
    prompt_tokens_total: int
    cached_tokens_total: int
    generation_tokens_total: int
    finished_total: int
    aborted_total: int
    preempted_total: int = 0
    retracted_total: int = 0
    evictable_blocks: int = 0
    block_size: int = 16
    new_token_ratio: float = 1.0

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks - self.evictable_blocks

    @property
    def token_usage(self) -> float:
        return self.used_blocks / self.total_blocks

    @property
    def cache_hit_rate(self) -> float:
        return (
            self.cached_tokens_total / self.prompt_tokens_total if self.prompt_tokens_total else 0.0
        )
