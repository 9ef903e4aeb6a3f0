"""The engine simulator's pure core: prefix cache, FIFO admission, LRU eviction, step costs.

No event loop: steps are driven by hand with simulated time.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.testkit.engine.core import EngineCore, Step, Submission
from luftpause.testkit.engine.params import EngineParams
from luftpause.testkit.engine.tokens import block_hashes

PARAMS = EngineParams(
    kv_tokens=64,
    block_size=4,
    max_running=8,
    prefill_ms_per_token=1.0,
    decode_base_ms=10.0,
    decode_ms_per_seq=2.0,
)


def prompt(tag: int, n: int) -> tuple[int, ...]:
    return tuple(tag * 1000 + i for i in range(n))


def sub(rid: str, tokens: tuple[int, ...], *, reserve: int = 1, output: int = 1) -> Submission:
    return Submission(rid=rid, prompt=tokens, reserve=reserve, output_tokens=output)


class Clock:
    """Drives a core step after step, each starting when the previous one ends."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.now = 0.0

    def step(self) -> Step | None:
        step = self.core.step(self.now)
        if step is not None:
            self.now = step.ends_at
        return step

    def drain(self) -> list[Step]:
        steps = []
        while (step := self.step()) is not None:
            steps.append(step)
        return steps


def test_a_repeated_prompt_is_served_from_the_full_blocks_of_the_first() -> None:
    core = EngineCore(PARAMS)
    clock = Clock(core)
    core.submit(sub("a", prompt(1, 42)))
    first = clock.drain()[0]
    assert first.admitted[0].cached_tokens == 0
    assert first.prefill_tokens == 42

    core.submit(sub("b", prompt(1, 42)))
    second = clock.step()
    assert second is not None
    assert second.admitted[0].cached_tokens == 40  # ten full blocks of four
    assert second.prefill_tokens == 2
    assert second.duration_ms == PARAMS.step_ms(prefill_tokens=2, decoding=1)


def test_a_fully_cached_prompt_still_computes_its_last_block() -> None:
    core = EngineCore(PARAMS)
    clock = Clock(core)
    core.submit(sub("a", prompt(1, 40)))
    clock.drain()
    core.submit(sub("b", prompt(1, 40)))
    step = clock.step()
    assert step is not None
    assert step.admitted[0].cached_tokens == 36
    assert step.prefill_tokens == 4


def test_requests_wait_in_fifo_order_while_the_pool_is_full_and_start_as_blocks_free() -> None:
    core = EngineCore(PARAMS)
    clock = Clock(core)
    core.submit(sub("big", prompt(1, 36), reserve=4, output=3))  # 10 of 16 blocks
    core.submit(sub("next", prompt(2, 28), reserve=4, output=1))  # 8 blocks: must wait
    core.submit(sub("small", prompt(3, 2), reserve=1, output=1))  # 1 block: waits behind it
    step = clock.step()
    assert step is not None
    assert [a.rid for a in step.admitted] == ["big"]
    assert (core.stats().running, core.stats().waiting) == (1, 2)

    admitted = [a.rid for s in clock.drain() for a in s.admitted]
    assert admitted == ["next", "small"]
    assert core.idle
    assert core.stats().used_blocks == 0


def test_lru_eviction_takes_the_least_recently_used_prefix_and_never_a_referenced_one() -> None:
    core = EngineCore(PARAMS)
    clock = Clock(core)
    p1, p2, p3 = prompt(1, 13), prompt(2, 13), prompt(3, 9)
    for rid, tokens in (("x", p1), ("y", p2), ("x-again", p1)):  # p1 is now the fresher
        core.submit(sub(rid, tokens, reserve=3))
        clock.drain()
    core.submit(sub("z", p3, reserve=7, output=7))  # stays running, holds p3's blocks
    clock.step()
    core.submit(sub("w", prompt(4, 32), reserve=4, output=4))  # 9 blocks: 6 free, 3 evicted
    clock.step()

    keys = {name: block_hashes(p, PARAMS.block_size) for name, p in {"p1": p1, "p2": p2}.items()}
    assert core.cache.match(keys["p2"]) == 0
    assert core.cache.match(keys["p1"]) == 3
    z_keys = block_hashes(p3, PARAMS.block_size)
    assert all(core.cache.refcount(k) >= 1 for k in z_keys)

    core.submit(sub("v", prompt(5, 12), reserve=4))  # 4 blocks; only p1's 3 are evictable
    clock.step()
    assert core.stats().waiting == 1
    assert all(core.cache.refcount(k) >= 1 for k in z_keys)


def test_eviction_takes_the_tail_of_a_prefix_before_its_head() -> None:
    core = EngineCore(PARAMS)
    clock = Clock(core)
    core.submit(sub("a", prompt(1, 13), reserve=3))  # three cached blocks once done
    clock.drain()
    core.submit(sub("b", prompt(2, 52), reserve=4))  # 14 blocks: 13 free + 1 evicted
    clock.drain()
    assert core.cache.match(block_hashes(prompt(1, 13), PARAMS.block_size)) == 2


def test_decode_step_time_grows_with_batch_size() -> None:
    def decode_step_ms(batch: int) -> float:
        core = EngineCore(PARAMS)
        clock = Clock(core)
        for i in range(batch):
            core.submit(sub(f"r{i}", prompt(i, 3), reserve=4, output=4))
        clock.step()  # the prefill step
        step = clock.step()
        assert step is not None and step.prefill_tokens == 0
        return step.duration_ms

    assert decode_step_ms(1) < decode_step_ms(2) < decode_step_ms(4)


def test_a_prefill_stalls_the_decode_step_of_the_whole_batch() -> None:
    core = EngineCore(PARAMS)
    clock = Clock(core)
    core.submit(sub("a", prompt(1, 3), reserve=8, output=8))
    clock.step()
    plain = clock.step()
    core.submit(sub("b", prompt(2, 30), reserve=2, output=2))
    stalled = clock.step()
    assert plain is not None and stalled is not None
    assert "a" in stalled.emitted
    assert stalled.duration_ms == PARAMS.step_ms(prefill_tokens=30, decoding=2)
    assert stalled.duration_ms > plain.duration_ms + 29


def test_a_single_pass_request_finishes_after_its_prefill_without_decoding() -> None:
    core = EngineCore(PARAMS)
    clock = Clock(core)
    core.submit(Submission(rid="c", prompt=prompt(1, 10), reserve=0, output_tokens=0))
    step = clock.step()
    assert step is not None
    assert step.finished == ("c",) and step.emitted == ()
    assert step.duration_ms == 10 * PARAMS.prefill_ms_per_token
    assert clock.step() is None and core.idle


def test_an_aborted_request_frees_its_blocks_and_is_counted() -> None:
    core = EngineCore(PARAMS)
    clock = Clock(core)
    core.submit(sub("a", prompt(1, 20), reserve=8, output=8))
    clock.step()
    assert core.stats().used_blocks == 7
    assert core.abort("a")
    assert core.stats().used_blocks == 0 and core.stats().aborted_total == 1
    assert clock.step() is None


def test_a_finished_reply_is_cached_for_the_follow_up_request() -> None:
    core = EngineCore(PARAMS)
    clock = Clock(core)
    history = prompt(1, 20) + prompt(9, 8)
    core.submit(
        Submission(rid="a", prompt=prompt(1, 20), reserve=8, output_tokens=8, history=history)
    )
    clock.drain()
    core.submit(sub("b", (*history, 7, 7, 7)))
    step = clock.step()
    assert step is not None and step.admitted[0].cached_tokens == 28


@settings(max_examples=60, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 30), st.integers(0, 6), st.integers(0, 6)),
        min_size=1,
        max_size=12,
    ),
    abort_at=st.lists(st.integers(0, 11), max_size=4),
)
def test_the_engine_never_overfills_the_pool_and_admits_in_arrival_order(
    reqs: list[tuple[int, int, int, int]], abort_at: list[int]
) -> None:
    """Invariants: free + private + cached == total; admission order is arrival order; every
    request that is not aborted emits exactly its output tokens; an idle engine holds nothing."""
    core = EngineCore(PARAMS)
    clock = Clock(core)
    aborted = {f"r{i}" for i in abort_at if i < len(reqs)}
    for i, (tag, n, extra, out) in enumerate(reqs):
        core.submit(sub(f"r{i}", prompt(tag, n), reserve=out + extra, output=out))
    admitted: list[str] = []
    emitted: dict[str, int] = {}
    for n_step in range(10_000):
        if n_step == 2:
            for rid in aborted:
                core.abort(rid)
        step = clock.step()
        cache = core.cache
        assert cache.free + cache.private + cache.cached == cache.total
        assert 0 <= cache.used <= cache.total
        if step is None:
            break
        admitted += [a.rid for a in step.admitted]
        for rid in step.emitted:
            emitted[rid] = emitted.get(rid, 0) + 1
    assert core.idle
    assert admitted == sorted(admitted, key=lambda rid: int(rid[1:]))
    for i, (_, _, _, out) in enumerate(reqs):
        if f"r{i}" not in aborted:
            assert emitted.get(f"r{i}", 0) == out
    assert core.cache.used == 0


def test_priority_scheduling_admits_the_best_priority_first_then_the_oldest() -> None:
    def order(priority_order: str) -> list[str]:
        core = EngineCore(
            EngineParams(
                kv_tokens=64,
                block_size=4,
                max_running=1,
                priority_order=priority_order,  # type: ignore[arg-type]
            )
        )
        clock = Clock(core)
        for rid, prio in (("first", 5), ("low", 1), ("high", 9), ("low-later", 1)):
            tokens = prompt(len(rid), 3)
            core.submit(
                Submission(rid=rid, prompt=tokens, reserve=1, output_tokens=1, priority=prio)
            )
        return [a.rid for s in clock.drain() for a in s.admitted]

    assert order("off") == ["first", "low", "high", "low-later"]
    assert order("low-first") == ["low", "low-later", "first", "high"]
    assert order("high-first") == ["high", "first", "low", "low-later"]


def _preempting(**kw: object) -> EngineCore:
    base: dict[str, object] = dict(
        kv_tokens=256,
        block_size=4,
        max_running=2,
        prefill_ms_per_token=1.0,
        decode_base_ms=10.0,
        decode_ms_per_seq=2.0,
        priority_order="low-first",
        preempt_threshold=10,
    )
    return EngineCore(EngineParams(**{**base, **kw}))  # type: ignore[arg-type]


def _long(rid: str, tag: int, priority: int, out: int = 20) -> Submission:
    tokens = prompt(tag, 16)
    return Submission(
        rid=rid,
        prompt=tokens,
        reserve=out,
        output_tokens=out,
        history=tokens + prompt(tag + 50, out),
        priority=priority,
    )


def test_a_waiting_request_preempts_the_latest_worse_one_which_resumes_from_its_cache() -> None:
    core = _preempting()
    clock = Clock(core)
    core.submit(_long("b1", 1, 100))
    core.submit(_long("b2", 2, 100))
    for _ in range(5):
        clock.step()
    core.submit(_long("i", 3, 0, out=3))
    step = clock.step()
    assert step is not None and [a.rid for a in step.admitted] == ["i"]
    assert "b2" not in step.emitted and "b1" in step.emitted  # the later batch turn gave way
    assert core.stats().preempted_total == 1 and core.stats().waiting == 1
    emitted: dict[str, int] = {}
    resumed_prefill = None
    for s in clock.drain():
        for rid in s.emitted:
            emitted[rid] = emitted.get(rid, 0) + 1
        if "b2" in s.emitted and resumed_prefill is None:
            resumed_prefill = s.prefill_tokens
    # b2 made 5 tokens before; it makes the other 15 after, re-prefilling one partial block.
    assert emitted["b2"] == 15 and emitted["i"] == 2
    assert resumed_prefill is not None and 0 < resumed_prefill < 4
    assert core.idle and core.cache.used == 0
    assert core.stats().admitted_total == 3  # the resumption is not a new admission


def test_no_preemption_within_the_threshold_or_without_it() -> None:
    for core in (_preempting(), _preempting(preempt_threshold=None)):
        clock = Clock(core)
        core.submit(_long("b1", 1, 5))
        core.submit(_long("b2", 2, 5))
        clock.step()
        core.submit(_long("i", 3, 0, out=3))  # better by 5: not by more than 10
        step = clock.step()
        assert step is not None and not step.admitted
        assert core.stats().preempted_total == 0 and core.stats().waiting == 1
    with pytest.raises(ValueError, match="priority order"):
        EngineParams(preempt_threshold=10)
    with pytest.raises(ValueError, match=">= 0"):
        EngineParams(priority_order="low-first", preempt_threshold=-1)


def test_high_first_preempts_the_lowest_number_and_only_as_many_as_the_blocks_need() -> None:
    # Each long request holds 9 blocks (16 + 20 tokens); the pool has 20: one victim suffices.
    core = _preempting(kv_tokens=80, max_running=4, priority_order="high-first")
    clock = Clock(core)
    core.submit(_long("low", 1, 0))
    core.submit(_long("mid", 2, 50))
    clock.step()
    core.submit(_long("urgent", 3, 100, out=3))
    step = clock.step()
    assert step is not None and [a.rid for a in step.admitted] == ["urgent"]
    assert "low" not in step.emitted and "mid" in step.emitted
    assert core.stats().preempted_total == 1


@settings(max_examples=60, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(
            st.integers(0, 3), st.integers(1, 30), st.integers(0, 8), st.sampled_from([0, 50])
        ),
        min_size=1,
        max_size=12,
    ),
    arrive=st.lists(st.integers(0, 12), min_size=12, max_size=12),
)
def test_preemption_keeps_the_pool_whole_and_every_request_emits_exactly_its_tokens(
    reqs: list[tuple[int, int, int, int]], arrive: list[int]
) -> None:
    core = EngineCore(
        EngineParams(
            kv_tokens=96,
            block_size=4,
            max_running=3,
            priority_order="low-first",
            preempt_threshold=10,
        )
    )
    clock = Clock(core)
    emitted: dict[str, int] = {}
    pending = sorted(range(len(reqs)), key=lambda i: arrive[i])
    for n_step in range(10_000):
        while pending and arrive[pending[0]] <= n_step:
            i = pending.pop(0)
            tag, n, out, prio = reqs[i]
            tokens = prompt(tag, n)
            core.submit(
                Submission(
                    rid=f"r{i}",
                    prompt=tokens,
                    reserve=out,
                    output_tokens=out,
                    history=tokens + prompt(tag + 10, out),
                    priority=prio,
                )
            )
        step = clock.step()
        cache = core.cache
        assert cache.free + cache.private + cache.cached == cache.total
        assert core.stats().running <= 3
        if step is None and not pending:
            break
        for rid in step.emitted if step else ():
            emitted[rid] = emitted.get(rid, 0) + 1
    assert core.idle and core.cache.used == 0
    for i, (_, _, out, _) in enumerate(reqs):
        assert emitted.get(f"r{i}", 0) == out
