"""The engine simulator's pure core: prefix cache, FIFO admission, LRU eviction, step costs.

No event loop: steps are driven by hand with simulated time.
"""

from __future__ import annotations

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
