"""The engine loop as a pure state machine: waiting queue, running batch, KV pool.

Pure module: no I/O, no clock reads; the caller passes `now` (simulated milliseconds) and
sleeps for the returned duration. Theory of operation, one `step(now)` per engine iteration:
1. retire the requests that emitted their last token in the previous iteration (their reply
   blocks are published to the prefix cache, then everything they hold is released);
2. admit from the head of the waiting queue while the head fits, the batch is under
   `max_running`, and the iteration's prefill stays under `max_prefill_tokens`;
3. prefill the admitted requests' uncached tokens, then run one decode step in which every
   running request emits one token. The prefill stalls that decode step for the whole batch,
   as in an engine without chunked prefill.
What "fits" means is the admission mode (`EngineParams.admission`):
- `reserve`: blocks for the head's prompt plus its whole reserved reply, less its cached
  prefix, are free or evictable; they are all allocated at admission, so a running request
  never runs out;
- `sglang` (the arithmetic is in `sglang`): the head's cost is below the free and evictable
  tokens less a ratio-discounted estimate of what the running batch still needs. Only the
  prompt's blocks are allocated at admission; a reply takes a block whenever it grows into a
  new one. When the decode step's blocks do not fit, running requests are retracted (fewest
  output tokens first, at least one kept): each releases all it holds (its prompt stays cached,
  unreferenced; its reply is dropped) and goes back to the front of the queue, to re-prefill
  its prompt and reply so far and go on emitting from where it stopped.
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

from luftpause.testkit.engine import sglang
from luftpause.testkit.engine.kvcache import PrefixCache
from luftpause.testkit.engine.params import EngineParams
from luftpause.testkit.engine.records import (
    Admitted,
    EngineStats,
    RequestTooLarge,
    Step,
    Submission,
)
from luftpause.testkit.engine.tokens import block_hashes

__all__ = ["Admitted", "EngineCore", "EngineStats", "RequestTooLarge", "Step", "Submission"]


class _Running:
    __slots__ = ("generated", "keys", "private", "sub")

    def __init__(self, sub: Submission, keys: list[int], private: int, generated: int) -> None:
        self.sub = sub
        self.keys = keys
        self.private = private
        self.generated = generated


class _Waiting:
    """A queued request: its prefix keys, and what it made before a preemption or retraction."""

    __slots__ = ("generated", "keys", "resumed", "sub")

    def __init__(
        self, sub: Submission, keys: list[int], generated: int = 0, resumed: bool = False
    ) -> None:
        self.sub = sub
        self.keys = keys
        self.generated = generated
        self.resumed = resumed  # it started before: its client saw its admission already


class EngineCore:
    """Mutable engine state; every method is pure computation."""

    def __init__(self, params: EngineParams) -> None:
        self.params = params
        self.cache = PrefixCache(params.total_blocks)
        self._sglang = params.admission == "sglang"
        self.new_token_ratio = sglang.INIT_NEW_TOKEN_RATIO if self._sglang else 1.0
        # sglang mode, during admission: each running request's share of the room it leaves.
        self._shares: dict[str, float] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._running: dict[str, _Running] = {}
        self._done: list[str] = []
        self._last_end = float("-inf")
        self.reset_counters()

    def reset_counters(self) -> None:
        self.admitted_total = self.prompt_tokens_total = self.cached_tokens_total = 0
        self.generation_tokens_total = self.finished_total = self.aborted_total = 0
        self.preempted_total = self.retracted_total = 0

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._running

    @property
    def queue(self) -> tuple[str, ...]:
        """Ids of the waiting requests in queue order (before any priority ordering)."""
        return tuple(self._waiting)

    def submit(self, sub: Submission) -> None:
        """Queue a request at the tail of the waiting queue."""
        p = self.params
        alone = sglang.admission_cost(
            uncached=len(sub.prompt), max_new=sub.reserve, generated=0, page_size=p.block_size
        )
        if p.blocks_for(len(sub.prompt) + sub.reserve) > self.cache.total or (
            self._sglang and alone >= p.pool_tokens
        ):
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
        retracted = self._make_room() if self._sglang else []
        emitted: list[str] = []
        finished: list[str] = []
        for rid, run in self._running.items():
            if run.generated < run.sub.output_tokens:
                if not self._grow(run):
                    continue  # only next to prefill-only requests that hold the last blocks
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
            retracted=tuple(retracted),
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
            retracted_total=self.retracted_total,
            evictable_blocks=self.cache.evictable,
            block_size=self.params.block_size,
            new_token_ratio=self.new_token_ratio,
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
        self._shares = self._running_shares()
        while self._waiting:
            rid, entry = self._head()
            sub, keys = entry.sub, entry.keys
            n_prompt = len(sub.prompt) + entry.generated
            # Like vLLM, at least the last prompt token is computed even on a full hit.
            hits = min(self.cache.match(keys), (n_prompt - 1) // p.block_size)
            uncached = n_prompt - hits * p.block_size
            if started and prefill + uncached > p.max_prefill_tokens:
                break
            n_new = p.blocks_for(n_prompt if self._sglang else len(sub.prompt) + sub.reserve)
            n_new -= hits
            demand = self._demand(entry, uncached, n_new)
            # An idle engine starts whatever fits: a resuming request's estimate may not.
            fits = self._fits(demand, self._room(keys[:hits])) or (
                not self._running and self.cache.can_allocate(keys[:hits], n_new)
            )
            if len(self._running) >= p.max_running or not fits:
                if not self._preempt_for(sub, demand, keys[:hits]):
                    break
                continue  # the victims may have cached blocks the head matches: look again
            self.cache.allocate(keys[:hits], n_new)
            self.cache.publish(keys[hits:])
            del self._waiting[rid]
            self._running[rid] = _Running(
                sub, list(keys), n_new - (len(keys) - hits), entry.generated
            )
            if self._sglang:
                self._shares[rid] = sglang.fresh_share(
                    uncached=uncached,
                    max_new=sub.reserve,
                    generated=entry.generated,
                    page_size=p.block_size,
                )
            prefill += uncached
            started += 1
            if entry.resumed:
                continue
            admitted.append(
                Admitted(rid=rid, prompt_tokens=n_prompt, cached_tokens=n_prompt - uncached)
            )
            self.admitted_total += 1
            self.prompt_tokens_total += n_prompt
            self.cached_tokens_total += n_prompt - uncached
        return admitted, prefill

    def _running_shares(self) -> dict[str, float]:
        if not self._sglang:
            return {}
        ratio = self.new_token_ratio
        return {
            rid: sglang.running_share(max_new=run.sub.reserve, generated=run.generated, ratio=ratio)
            for rid, run in self._running.items()
        }

    def _demand(self, entry: _Waiting, uncached: int, n_new: int) -> int:
        """Tokens the head needs room for: its SGLang cost, or its blocks when reserving."""
        if self._sglang:
            return sglang.admission_cost(
                uncached=uncached,
                max_new=entry.sub.reserve,
                generated=entry.generated,
                page_size=self.params.block_size,
            )
        return n_new * self.params.block_size

    def _room(self, hits: list[int]) -> float:
        """Tokens free or evictable beside `hits`, less the running batch's shares (sglang)."""
        return self.cache.room(hits) * self.params.block_size - sum(self._shares.values())

    def _fits(self, demand: float, room: float) -> bool:
        return demand < room if self._sglang else demand <= room

    def _growth(self, run: _Running) -> int:
        """Blocks `run` must add before its next token (sglang mode: the reply grows)."""
        held = len(run.keys) + run.private
        return max(0, self.params.blocks_for(len(run.sub.prompt) + run.generated) - held)

    def _grow(self, run: _Running) -> bool:
        """Take the block the next token of `run` needs, if any; False when there is none."""
        need = self._growth(run) if self._sglang else 0
        if need and not self.cache.can_allocate((), need):
            return False
        if need:
            self.cache.allocate((), need)
            run.private += need
        return True

    def _make_room(self) -> list[str]:
        """Retract running requests until the decode step's blocks fit; returns their ids."""
        decoding = [
            (rid, run)
            for rid, run in self._running.items()
            if run.generated < run.sub.output_tokens
        ]
        need = sum(self._growth(run) for _, run in decoding)
        if need <= self.cache.room():
            if decoding:
                self.new_token_ratio = sglang.decayed(self.new_token_ratio)
            return []
        decoding.sort(
            key=lambda item: sglang.retraction_key(
                generated=item[1].generated, prompt_tokens=len(item[1].sub.prompt)
            )
        )
        retracted: dict[str, _Waiting] = {}
        for rid, run in decoding[:-1]:  # at least one is kept
            if need <= self.cache.room():
                break
            need -= self._growth(run)
            del self._running[rid]
            # Nothing is published for it: what it referenced stays cached, its reply is freed.
            self.cache.release(run.keys, run.private)
            retracted[rid] = _Waiting(run.sub, run.keys, run.generated, resumed=True)
        self._waiting = retracted | self._waiting  # to the front of the queue
        self.retracted_total += len(retracted)
        kept = [run for _, run in decoding if run.sub.rid not in retracted]
        self.new_token_ratio = sglang.ratio_after_retraction(
            [run.generated for run in kept], [run.sub.reserve for run in kept]
        )
        return list(retracted)

    def _preempt_for(self, head: Submission, demand: int, hits: list[int]) -> bool:
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
        room = self._room(hits)
        for rid, run in candidates:
            if sign * (run.sub.priority - head.priority) <= threshold:
                break  # sorted: every later candidate is closer to the head's priority
            if run.generated >= run.sub.output_tokens:
                continue  # done in this iteration; it leaves anyway
            victims.append(rid)
            # What the victim frees: private blocks, prefixes only it holds, and its share.
            freeable = run.private + sum(1 for k in run.keys if self.cache.refcount(k) == 1)
            room += freeable * self.params.block_size + self._shares.get(rid, 0.0)
            if self._fits(demand, room):
                break  # any victim frees a slot; now the blocks fit too
        if not victims or not self._fits(demand, room):
            return False
        for rid in victims:
            run = self._running.pop(rid)
            self._shares.pop(rid, None)
            # What it computed stays cached; it goes on from there when it starts again.
            self._waiting[rid] = _Waiting(run.sub, self._leave(run), run.generated, resumed=True)
            self.preempted_total += 1
        return True
