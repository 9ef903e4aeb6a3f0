"""The engine loop as a pure state machine: waiting queue, running batch, KV pool.

Pure module: no I/O, no clock reads; the caller passes `now` (simulated milliseconds) and
sleeps for the returned duration. Theory of operation, one `step(now)` per engine iteration:
1. retire the requests that emitted their last token in the previous iteration (their reply
   is published to the prefix cache, then everything they hold is released);
2. admit from the head of the waiting queue while the head fits, the batch is under
   `max_running`, and there is prefill budget left (below);
3. prefill admitted requests' uncached tokens, then run one decode step in which every running
   request whose prompt is computed emits one token.
What "fits" means is the admission mode (`EngineParams.admission`):
- `reserve`: blocks for the head's prompt plus its whole reserved reply, less its cached
  prefix, are free or evictable; they are all allocated at admission, so a running request
  never runs out;
- `sglang` (the arithmetic is in `sglang`): the head's cost is below the free and evictable
  tokens less a ratio-discounted estimate of what the running batch still needs;
- `ondemand`: the head's uncached prompt plus its reply reserve
  (`EngineParams.reply_reserve_tokens`) fit what is free or evictable now; what the running
  requests' replies will still take is not counted.
In `sglang` and `ondemand` only the prompt's blocks are allocated at admission; a reply takes a
block whenever it grows into a new one. When the decode step's blocks do not fit, running
requests are retracted until they do (SGLang: fewest output tokens first; `ondemand`, as vLLM
preempts: the latest admitted first), at least one kept: each releases all it holds (its prompt
stays cached, unreferenced; its reply is dropped) and goes back to the front of the queue, to
re-prefill its prompt and reply so far and go on emitting from where it stopped.
How prompts are computed is the chunked-prefill mode (`EngineParams.chunked_prefill`):
- `off`: an admitted request's uncached tokens are all computed in the iteration that admits
  it, which also runs the decode step (the prefill stalls it); the iteration admits while its
  prefill stays under `max_prefill_tokens` (the first admitted request always passes);
- `mixed`: each iteration computes up to `chunk_tokens` less one per decoding request of the
  admitted prompts, oldest first, beside the decode step;
- `separate`: an iteration with prompt tokens to compute computes up to `chunk_tokens` of them
  and nothing else; the batch decodes only in iterations without any.
In both chunked modes a request is admitted only while fewer than `chunk_tokens` admitted prompt
tokens wait to be computed, and it emits its first token in the iteration that finishes its
prompt. The prefix cache's keys are the prompt's blocks or messages (`prefix_cache`, see
`tokens.prefix_keys`); a matched prefix costs no prefill, but the last prompt token is always
computed.
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

from collections.abc import Sequence

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
from luftpause.testkit.engine.tokens import prefix_keys

__all__ = ["Admitted", "EngineCore", "EngineStats", "RequestTooLarge", "Step", "Submission"]


class _Prefix:
    """Prefix-cache keys of a token sequence and the blocks covered up to each."""

    __slots__ = ("ends", "keys")

    def __init__(self, keys: list[int], ends: list[int]) -> None:
        self.keys = keys
        self.ends = ends

    def blocks(self, n: int) -> int:
        """Blocks covered by the first `n` keys."""
        return self.ends[n - 1] if n else 0

    def sizes(self, start: int, stop: int) -> list[int]:
        """Blocks each of keys[start:stop] covers."""
        return [self.ends[i] - self.blocks(i) for i in range(start, stop)]

    def upto(self, blocks: int) -> int:
        """How many keys, from the first, end within `blocks`."""
        n = 0
        while n < len(self.ends) and self.ends[n] <= blocks:
            n += 1
        return n


class _Running:
    __slots__ = ("generated", "pending", "prefix", "private", "sub")

    def __init__(
        self, sub: Submission, prefix: _Prefix, private: int, generated: int, pending: int
    ) -> None:
        self.sub = sub
        self.prefix = prefix  # the keys it references (all cached)
        self.private = private
        self.generated = generated
        self.pending = pending  # prompt tokens still to compute (chunked prefill)


class _Waiting:
    """A queued request: its prefix keys, and what it made before a preemption or retraction."""

    __slots__ = ("generated", "prefix", "resumed", "sub")

    def __init__(
        self, sub: Submission, prefix: _Prefix, generated: int = 0, resumed: bool = False
    ) -> None:
        self.sub = sub
        self.prefix = prefix
        self.generated = generated
        self.resumed = resumed  # it started before: its client saw its admission already


class EngineCore:
    """Mutable engine state; every method is pure computation."""

    def __init__(self, params: EngineParams) -> None:
        self.params = params
        self.cache = PrefixCache(params.total_blocks, params.eviction)
        self._sglang = params.admission == "sglang"
        self._grows = params.admission != "reserve"  # replies take blocks as they grow
        self._chunked = params.chunked_prefill != "off"
        self._separate = params.chunked_prefill == "separate"
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
        reply = sub.reserve
        if p.admission == "ondemand":  # what it asks for, and what it will really take
            reply = max(p.reply_reserve_tokens(sub.reserve), sub.output_tokens)
        if p.blocks_for(len(sub.prompt) + reply) > self.cache.total or (
            self._sglang and alone >= p.pool_tokens
        ):
            raise RequestTooLarge(f"{len(sub.prompt)} + {sub.reserve} tokens exceed the KV pool")
        if sub.rid in self._waiting or sub.rid in self._running:
            raise ValueError(f"duplicate request id {sub.rid}")
        self._waiting[sub.rid] = _Waiting(sub, self._prefix(sub.prompt, sub.prompt_cuts))

    def abort(self, rid: str) -> bool:
        """Drop a waiting or running request; True when it had not finished yet."""
        if self._waiting.pop(rid, None) is not None:
            self.aborted_total += 1
            return True
        run = self._running.pop(rid, None)
        if run is None:
            return False
        self.cache.release(run.prefix.keys, run.private)
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
        admitted = self._admit()
        prefill, computed = self._prefill()
        everyone = not (self._separate and prefill)  # a prefill-only pass: only its own
        decoders = [
            (rid, run)
            for rid, run in self._running.items()
            if not run.pending and (everyone or rid in computed)
        ]
        retracted = self._make_room(decoders) if self._grows else []
        emitted: list[str] = []
        finished: list[str] = []
        for rid, run in decoders:
            if rid in retracted:
                continue
            if run.generated < run.sub.output_tokens:
                if not self._grow(run):
                    continue  # only next to prefill-only requests that hold the last blocks
                run.generated += 1
                emitted.append(rid)
                if run.generated == run.sub.output_tokens:
                    finished.append(rid)
            elif run.sub.output_tokens == 0:
                finished.append(rid)
        if not admitted and not emitted and not prefill and not finished:
            return None
        self._done = finished
        self.generation_tokens_total += len(emitted)
        p = self.params
        if self._separate and prefill:  # the first tokens come out of the prefill pass
            duration = prefill * p.prefill_ms_per_token
        else:
            duration = p.step_ms(prefill_tokens=prefill, decoding=len(emitted))
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

    # --- keys and leaving --------------------------------------------------------------------

    def _prefix(self, tokens: Sequence[int], cuts: Sequence[int]) -> _Prefix:
        p = self.params
        return _Prefix(*prefix_keys(tokens, cuts, p.prefix_cache, p.block_size))

    def _computed(self, run: _Running) -> _Prefix:
        """Keys of what `run` has computed: its prompt's and its reply's so far (a finished
        reply's whole message: its end marker is the model's last token)."""
        sub = run.sub
        if not sub.history:
            return run.prefix
        hist = self._prefix(sub.history, sub.history_cuts)
        done = run.generated >= sub.output_tokens
        computed = (len(sub.history) if done else len(sub.prompt) + run.generated) // (
            self.params.block_size
        )
        have = len(run.prefix.keys)
        n = max(hist.upto(computed), have)
        return _Prefix(run.prefix.keys + hist.keys[have:n], run.prefix.ends + hist.ends[have:n])

    def _leave(self, run: _Running) -> _Prefix:
        """Publish what `run` computed, release all it holds; returns its computed keys."""
        computed = self._computed(run)
        have = len(run.prefix.keys)
        sizes = computed.sizes(have, len(computed.keys))
        short = sum(sizes) - run.private  # the reply's last blocks, when none were taken yet
        if short > 0 and self.cache.can_allocate((), short):
            self.cache.allocate((), short)
            run.private += short
        while sum(sizes) > run.private:  # no room for them: they are not cached
            sizes.pop()
        keys = computed.keys[: have + len(sizes)]
        self.cache.publish(keys[have:], sizes)
        self.cache.release(keys, run.private - sum(sizes))
        return _Prefix(keys, computed.ends[: len(keys)])

    def _retire(self) -> None:
        for rid in self._done:
            run = self._running.pop(rid, None)
            if run is None:
                continue
            self._leave(run)
            self.finished_total += 1
        self._done = []

    # --- admission -----------------------------------------------------------------------------

    def _head(self) -> tuple[str, _Waiting]:
        order = self.params.priority_order
        if order == "off":
            return next(iter(self._waiting.items()))
        sign = 1 if order == "low-first" else -1
        # min() keeps the first of equals: the oldest, as the dict keeps arrival order.
        return min(self._waiting.items(), key=lambda item: sign * item[1].sub.priority)

    def _backlog(self) -> int:
        """Admitted prompt tokens still to compute."""
        return sum(run.pending for run in self._running.values())

    def _admit(self) -> list[Admitted]:
        """Start what fits from the head of the queue; returns the new starts."""
        p = self.params
        admitted: list[Admitted] = []
        prefill = self._backlog() if self._chunked else 0
        limit = p.chunk_tokens if self._chunked else p.max_prefill_tokens
        started = 0
        self._shares = self._running_shares()
        while self._waiting:
            rid, entry = self._head()
            sub, prefix = entry.sub, entry.prefix
            n_prompt = len(sub.prompt) + entry.generated
            hits = min(self.cache.match(prefix.keys), prefix.upto((n_prompt - 1) // p.block_size))
            hit_blocks = prefix.blocks(hits)
            uncached = n_prompt - hit_blocks * p.block_size
            if self._chunked:
                if prefill >= limit:
                    break
            elif started and prefill + uncached > limit:
                break
            reply = 0 if self._grows else sub.reserve
            n_new = p.blocks_for(n_prompt if self._grows else len(sub.prompt) + reply)
            n_new -= hit_blocks
            hit_keys = prefix.keys[:hits]
            demand = self._demand(entry, uncached, n_new)
            # An idle engine starts whatever fits: a resuming request's estimate may not.
            fits = self._fits(demand, self._room(hit_keys)) or (
                not self._running and self.cache.can_allocate(hit_keys, n_new)
            )
            if len(self._running) >= p.max_running or not fits:
                if not self._preempt_for(sub, demand, hit_keys):
                    break
                continue  # the victims may have cached blocks the head matches: look again
            self.cache.allocate(hit_keys, n_new)
            sizes = prefix.sizes(hits, len(prefix.keys))
            self.cache.publish(prefix.keys[hits:], sizes)
            del self._waiting[rid]
            self._running[rid] = _Running(
                sub, prefix, n_new - sum(sizes), entry.generated, uncached
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
        return admitted

    def _running_shares(self) -> dict[str, float]:
        if not self._sglang:
            return {}
        ratio = self.new_token_ratio
        return {
            rid: sglang.running_share(max_new=run.sub.reserve, generated=run.generated, ratio=ratio)
            for rid, run in self._running.items()
        }

    def _demand(self, entry: _Waiting, uncached: int, n_new: int) -> int:
        """Tokens the head needs room for: its SGLang cost, its blocks when reserving, or its
        prompt's blocks and its reply reserve (`ondemand`)."""
        p = self.params
        sub = entry.sub
        if self._sglang:
            return sglang.admission_cost(
                uncached=uncached,
                max_new=sub.reserve,
                generated=entry.generated,
                page_size=p.block_size,
            )
        if self._grows:
            reserve = p.reply_reserve_tokens(max(sub.reserve - entry.generated, 0))
            return (n_new + p.blocks_for(reserve)) * p.block_size
        return n_new * p.block_size

    def _room(self, hits: Sequence[int]) -> float:
        """Tokens free or evictable beside `hits`, less the running batch's shares (sglang)."""
        return self.cache.room(hits) * self.params.block_size - sum(self._shares.values())

    def _fits(self, demand: float, room: float) -> bool:
        return demand < room if self._sglang else demand <= room

    # --- prefill and decode ----------------------------------------------------------------

    def _prefill(self) -> tuple[int, set[str]]:
        """Compute admitted prompts' tokens, oldest first, up to this iteration's budget;
        returns the tokens computed and the requests whose prompt is now whole."""
        backlog = self._backlog()
        budget = backlog
        if self._separate:
            budget = min(backlog, self.params.chunk_tokens)
        elif self._chunked:  # decoding requests take a token each of the chunk (vLLM)
            decoding = sum(
                1
                for run in self._running.values()
                if not run.pending and run.generated < run.sub.output_tokens
            )
            budget = min(backlog, max(self.params.chunk_tokens - decoding, 1))
        done = 0
        computed: set[str] = set()
        for rid, run in self._running.items():
            if done >= budget:
                break
            if not run.pending:
                continue
            take = min(run.pending, budget - done)
            run.pending -= take
            done += take
            if not run.pending:
                computed.add(rid)
        return done, computed

    def _growth(self, run: _Running) -> int:
        """Blocks `run` must add before its next token (its reply grows on demand)."""
        held = run.prefix.blocks(len(run.prefix.keys)) + run.private
        return max(0, self.params.blocks_for(len(run.sub.prompt) + run.generated) - held)

    def _grow(self, run: _Running) -> bool:
        """Take the block the next token of `run` needs, if any; False when there is none."""
        need = self._growth(run) if self._grows else 0
        if need and not self.cache.can_allocate((), need):
            return False
        if need:
            self.cache.allocate((), need)
            run.private += need
        return True

    def _make_room(self, decoders: list[tuple[str, _Running]]) -> list[str]:
        """Retract running requests until the decode step's blocks fit; returns their ids."""
        decoding = [(rid, run) for rid, run in decoders if run.generated < run.sub.output_tokens]
        need = sum(self._growth(run) for _, run in decoding)
        if need <= self.cache.room():
            if decoding and self._sglang:
                self.new_token_ratio = sglang.decayed(self.new_token_ratio)
            return []
        if self._sglang:
            decoding.sort(
                key=lambda item: sglang.retraction_key(
                    generated=item[1].generated, prompt_tokens=len(item[1].sub.prompt)
                )
            )
        else:  # vLLM preempts the latest admitted first
            decoding.reverse()
        retracted: dict[str, _Waiting] = {}
        for rid, run in decoding[:-1]:  # at least one is kept
            if need <= self.cache.room():
                break
            need -= self._growth(run)
            del self._running[rid]
            # Nothing is published for it: what it referenced stays cached, its reply is freed.
            self.cache.release(run.prefix.keys, run.private)
            retracted[rid] = _Waiting(run.sub, run.prefix, run.generated, resumed=True)
        self._waiting = retracted | self._waiting  # to the front of the queue
        self.retracted_total += len(retracted)
        if self._sglang:
            kept = [run for _, run in decoding if run.sub.rid not in retracted]
            self.new_token_ratio = sglang.ratio_after_retraction(
                [run.generated for run in kept], [run.sub.reserve for run in kept]
            )
        return list(retracted)

    def _preempt_for(self, head: Submission, demand: int, hits: Sequence[int]) -> bool:
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
        cache = self.cache
        for rid, run in candidates:
            if sign * (run.sub.priority - head.priority) <= threshold:
                break  # sorted: every later candidate is closer to the head's priority
            if run.generated >= run.sub.output_tokens:
                continue  # done in this iteration; it leaves anyway
            victims.append(rid)
            # What the victim frees: private blocks, prefixes only it holds, and its share.
            freeable = run.private + sum(
                cache.size(k) for k in run.prefix.keys if cache.refcount(k) == 1
            )
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
