"""The engine loop as a pure state machine: waiting queue, running batch, KV pool.

Pure module: no I/O, no clock reads; the caller passes `now` (simulated milliseconds) and
sleeps for the returned duration. Theory of operation, one `step(now)` per engine iteration:
1. retire the requests that emitted their last token in the previous iteration (their reply
   blocks are published to the prefix cache, then everything they hold is released);
2. admit from the head of the waiting queue while the head's blocks fit
   (prompt plus reserved reply tokens, less its cached prefix), the batch is under
   `max_running`, and the iteration's prefill stays under `max_prefill_tokens`;
3. prefill the admitted requests' uncached tokens, then run one decode step in which every
   running request emits one token. The prefill stalls that decode step for the whole batch,
   as in an engine without chunked prefill.
The head is the oldest request, or, with `priority_order` set, the oldest of the best
`priority`. With `preempt_threshold` set too, a head that cannot start (the batch is full or its
blocks do not fit) preempts running requests whose priority is worse than its own by more than
the threshold, as SGLang with `--enable-priority-scheduling` does: the worst first, the latest
admitted of equals first, and only when enough of them free the slot and blocks it needs. A
preempted request leaves what it computed (prompt and reply so far) in the prefix cache and
goes back to the tail of the waiting queue; when it starts again it re-prefills only what was
evicted meanwhile, and goes on emitting from where it stopped.
The returned `Step` says what happened; its effects are visible at `now + duration_ms`.
A request with `output_tokens == 0` is single-pass: prefill only, done after its iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.testkit.engine.kvcache import PrefixCache
from luftpause.testkit.engine.params import EngineParams
from luftpause.testkit.engine.tokens import block_hashes


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

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("a prompt has at least one token")
        if not 0 <= self.output_tokens <= self.reserve:
            raise ValueError("output_tokens must be within 0..reserve")


@dataclass(frozen=True, slots=True, kw_only=True)
class Admitted:
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

    @property
    def ends_at(self) -> float:
        return self.at + self.duration_ms


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStats:
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

    @property
    def token_usage(self) -> float:
        return self.used_blocks / self.total_blocks

    @property
    def cache_hit_rate(self) -> float:
        return (
            self.cached_tokens_total / self.prompt_tokens_total if self.prompt_tokens_total else 0.0
        )


class _Running:
    __slots__ = ("generated", "keys", "private", "sub")

    def __init__(self, sub: Submission, keys: list[int], private: int, generated: int) -> None:
        self.sub = sub
        self.keys = keys
        self.private = private
        self.generated = generated


class _Waiting:
    """A queued request: its prefix keys, and the reply tokens it made before a preemption."""

    __slots__ = ("generated", "keys", "sub")

    def __init__(self, sub: Submission, keys: list[int], generated: int = 0) -> None:
        self.sub = sub
        self.keys = keys
        self.generated = generated


class EngineCore:
    """Mutable engine state; every method is pure computation."""

    def __init__(self, params: EngineParams) -> None:
        self.params = params
        self.cache = PrefixCache(params.total_blocks)
        self._waiting: dict[str, _Waiting] = {}
        self._running: dict[str, _Running] = {}
        self._done: list[str] = []
        self._last_end = float("-inf")
        self.reset_counters()

    def reset_counters(self) -> None:
        self.admitted_total = self.prompt_tokens_total = self.cached_tokens_total = 0
        self.generation_tokens_total = self.finished_total = self.aborted_total = 0
        self.preempted_total = 0

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._running

    def submit(self, sub: Submission) -> None:
        """Queue a request at the tail of the waiting queue."""
        if self.params.blocks_for(len(sub.prompt) + sub.reserve) > self.cache.total:
            raise RequestTooLarge(f"{len(sub.prompt)} + {sub.reserve} tokens exceed the KV pool")
        if sub.rid in self._waiting or sub.rid in self._running:
            raise ValueError(f"duplicate request id {sub.rid}")
        self._waiting[sub.rid] = _Waiting(sub, block_hashes(sub.prompt, self.params.block_size))

    def abort(self, rid: str) -> bool:
        """Drop a waiting or running request; True when it had not finished yet."""
        if self._waiting.pop(rid, None) is not None:
            self.aborted_total += 1
            return True
        run = self._running.pop(rid, None)
        if run is None:
            return False
        self.cache.release(run.keys, run.private)
        if run.generated < run.sub.output_tokens:
            self.aborted_total += 1
            return True
        self.finished_total += 1
        return False

    def step(self, now: float) -> Step | None:
        """Run one iteration starting at `now`; None when there is nothing to do."""
        if now < self._last_end:
            raise ValueError("step started before the previous one ended")
        self._retire()
        admitted, prefill = self._admit()
        emitted: list[str] = []
        finished: list[str] = []
        for rid, run in self._running.items():
            if run.generated < run.sub.output_tokens:
                run.generated += 1
                emitted.append(rid)
                if run.generated == run.sub.output_tokens:
                    finished.append(rid)
            elif run.sub.output_tokens == 0:
                finished.append(rid)
        if not admitted and not emitted:
            return None
        self._done = finished
        self.generation_tokens_total += len(emitted)
        duration = self.params.step_ms(prefill_tokens=prefill, decoding=len(emitted))
        self._last_end = now + duration
        return Step(
            at=now,
            duration_ms=duration,
            prefill_tokens=prefill,
            batch=len(self._running),
            admitted=tuple(admitted),
            emitted=tuple(emitted),
            finished=tuple(finished),
        )

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            total_blocks=self.cache.total,
            used_blocks=self.cache.used,
            cached_blocks=self.cache.cached,
            admitted_total=self.admitted_total,
            prompt_tokens_total=self.prompt_tokens_total,
            cached_tokens_total=self.cached_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            finished_total=self.finished_total,
            aborted_total=self.aborted_total,
            preempted_total=self.preempted_total,
        )

    def _retire(self) -> None:
        for rid in self._done:
            run = self._running.pop(rid, None)
            if run is None:
                continue
            self._leave(run)
            self.finished_total += 1
        self._done = []

    def _computed_keys(self, run: _Running) -> list[int]:
        """Keys of the full blocks `run` has computed: its prompt and its reply so far."""
        sub = run.sub
        if not sub.history:
            return run.keys
        hist = block_hashes(sub.history, self.params.block_size)
        computed = (len(sub.prompt) + run.generated) // self.params.block_size
        return run.keys + hist[len(run.keys) : min(len(hist), computed)]

    def _leave(self, run: _Running) -> list[int]:
        """Publish what `run` computed, release all it holds; returns its computed keys."""
        keys = self._computed_keys(run)
        extra = keys[len(run.keys) :]
        self.cache.publish(extra)
        self.cache.release(keys, run.private - len(extra))
        return keys

    def _head(self) -> tuple[str, _Waiting]:
        order = self.params.priority_order
        if order == "off":
            return next(iter(self._waiting.items()))
        sign = 1 if order == "low-first" else -1
        # min() keeps the first of equals: the oldest, as the dict keeps arrival order.
        return min(self._waiting.items(), key=lambda item: sign * item[1].sub.priority)

    def _admit(self) -> tuple[list[Admitted], int]:
        """Start what fits from the head of the queue; returns the new starts and prefill."""
        p = self.params
        admitted: list[Admitted] = []
        prefill = 0
        started = 0
        while self._waiting:
            rid, entry = self._head()
            sub, keys = entry.sub, entry.keys
            n_prompt = len(sub.prompt) + entry.generated
            # Like vLLM, at least the last prompt token is computed even on a full hit.
            hits = min(self.cache.match(keys), (n_prompt - 1) // p.block_size)
            uncached = n_prompt - hits * p.block_size
            if started and prefill + uncached > p.max_prefill_tokens:
                break
            n_new = p.blocks_for(len(sub.prompt) + sub.reserve) - hits
            full = len(self._running) >= p.max_running
            if full or not self.cache.can_allocate(keys[:hits], n_new):
                if not self._preempt_for(sub, keys[:hits], n_new):
                    break
                continue  # the victims may have cached blocks the head matches: look again
            self.cache.allocate(keys[:hits], n_new)
            self.cache.publish(keys[hits:])
            del self._waiting[rid]
            self._running[rid] = _Running(
                sub, list(keys), n_new - (len(keys) - hits), entry.generated
            )
            prefill += uncached
            started += 1
            if entry.generated:
                continue  # a preempted request resuming: its client saw its admission already
            admitted.append(
                Admitted(rid=rid, prompt_tokens=n_prompt, cached_tokens=n_prompt - uncached)
            )
            self.admitted_total += 1
            self.prompt_tokens_total += n_prompt
            self.cached_tokens_total += n_prompt - uncached
        return admitted, prefill

    def _preempt_for(self, head: Submission, hits: list[int], n_new: int) -> bool:
        """Preempt running requests so that `head` can start; False (and none) if it can't."""
        threshold = self.params.preempt_threshold
        if threshold is None:
            return False
        sign = 1 if self.params.priority_order == "low-first" else -1
        # Worst priority first; of equals, the latest admitted first (dicts keep order).
        candidates = sorted(
            reversed(self._running.items()), key=lambda item: -sign * item[1].sub.priority
        )
        victims: list[str] = []
        freeable = 0  # blocks the victims would free: private, and prefixes only they hold
        for rid, run in candidates:
            if sign * (run.sub.priority - head.priority) <= threshold:
                break  # sorted: every later candidate is closer to the head's priority
            if run.generated >= run.sub.output_tokens:
                continue  # done in this iteration; it leaves anyway
            victims.append(rid)
            freeable += run.private + sum(1 for k in run.keys if self.cache.refcount(k) == 1)
            if self.cache.can_allocate(hits, n_new - freeable):
                break  # any victim frees a slot; now the blocks fit too
        if not victims or not self.cache.can_allocate(hits, n_new - freeable):
            return False
        for rid in victims:
            run = self._running.pop(rid)
            # What it computed stays cached; it goes on from there when it starts again.
            self._waiting[rid] = _Waiting(run.sub, self._leave(run), run.generated)
            self.preempted_total += 1
        return True
