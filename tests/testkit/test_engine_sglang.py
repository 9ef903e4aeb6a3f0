"""The engine core in SGLang's admission mode: ratio-discounted admission, reply blocks on
demand, retraction, the new-token ratio; and its arithmetic in `sglang`.

No event loop: steps are driven by hand with simulated time.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from luftpause.testkit.engine import sglang
from luftpause.testkit.engine.core import EngineCore, RequestTooLarge, Step, Submission
from luftpause.testkit.engine.params import Admission, EngineParams
from luftpause.testkit.engine.tokens import block_hashes

DECAY = (0.7 - 0.7 * 0.14) / 600


def engine(admission: Admission = "sglang", **kw: Any) -> EngineCore:
    base: dict[str, Any] = dict(
        kv_tokens=128,
        block_size=4,
        max_running=8,
        prefill_ms_per_token=1.0,
        decode_base_ms=10.0,
        decode_ms_per_seq=2.0,
        admission=admission,
    )
    return EngineCore(EngineParams(**{**base, **kw}))


def sub(rid: str, tag: int, n: int = 4, *, out: int = 62, reserve: int | None = None) -> Submission:
    tokens = tuple(tag * 1000 + i for i in range(n))
    return Submission(rid=rid, prompt=tokens, reserve=reserve or out, output_tokens=out)


class Run:
    """Drives a core step after step and counts what each request emitted."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.now = 0.0
        self.emitted: dict[str, int] = {}

    def step(self) -> Step | None:
        step = self.core.step(self.now)
        if step is not None:
            self.now = step.ends_at
            for rid in step.emitted:
                self.emitted[rid] = self.emitted.get(rid, 0) + 1
        return step

    def drain(self) -> list[Step]:
        steps = []
        while (step := self.step()) is not None:
            steps.append(step)
        return steps


def test_the_constants_are_sglangs() -> None:
    assert sglang.INIT_NEW_TOKEN_RATIO == 0.7
    assert pytest.approx(0.098) == sglang.MIN_NEW_TOKEN_RATIO
    assert pytest.approx(DECAY) == sglang.NEW_TOKEN_RATIO_DECAY
    assert sglang.admission_cost(uncached=10, max_new=5000, generated=0, page_size=16) == 4122
    assert sglang.fresh_share(uncached=10, max_new=100, generated=40, page_size=16) == 76
    assert sglang.running_share(max_new=100, generated=40, ratio=0.5) == 30.0
    assert sglang.ratio_after_retraction([10, 30], [100, 200]) == pytest.approx(80 / 301)
    assert sglang.ratio_after_retraction([90], [100]) == 1.0


def test_sglang_mode_runs_more_requests_at_once_than_reserving_whole_replies() -> None:
    def most_running(admission: Admission) -> tuple[int, EngineCore, Run]:
        core = engine(admission, kv_tokens=4096, block_size=16, max_running=64)
        run = Run(core)
        for i in range(40):  # 200 + 1000 reserved tokens each: three fit when reserving
            core.submit(sub(f"r{i}", i, 200, out=300, reserve=1000))
        most = 0
        while run.step() is not None:
            most = max(most, core.stats().running)
        return most, core, run

    reserving, _, _ = most_running("reserve")
    ratio, core, run = most_running("sglang")
    assert reserving == 3
    assert ratio >= 2 * reserving
    assert run.emitted == {f"r{i}": 300 for i in range(40)}
    assert core.idle and core.cache.used == 0


def test_a_new_request_reserves_its_whole_reply_but_a_running_one_only_the_ratio() -> None:
    # 256 blocks of 4. `a` runs: 399 tokens left, counted at the ratio after one decode step.
    room = 255 * 4 - 399 * (0.7 - DECAY)  # 741.1 tokens
    for reserve, starts in ((733, True), (734, False)):  # cost 4 + reserve + 4 against room
        assert (4 + reserve + 4 < room) is starts
        core = engine(kv_tokens=1024)
        run = Run(core)
        core.submit(sub("a", 1, out=400))
        run.step()
        core.submit(sub("b", 2, out=1, reserve=reserve))
        step = run.step()
        assert step is not None
        assert [a.rid for a in step.admitted] == (["b"] if starts else [])
    # Reserving, `a` alone takes 101 of the 256 blocks, and `b` needs 185.
    core = engine("reserve", kv_tokens=1024)
    run = Run(core)
    core.submit(sub("a", 1, out=400))
    run.step()
    core.submit(sub("b", 2, out=1, reserve=733))
    step = run.step()
    assert step is not None and not step.admitted


def test_only_the_prompt_is_allocated_at_admission_and_the_reply_grows_block_by_block() -> None:
    core = engine()
    run = Run(core)
    core.submit(sub("a", 1, 6, out=20))
    held = []
    for _ in range(10):
        run.step()
        held.append(core.stats().used_blocks)
    # 6 prompt tokens: 2 blocks; before its n-th token it holds 6 + n - 1 tokens of KV.
    assert held == [-(-(6 + max(n - 1, 0)) // 4) for n in range(1, 11)]


def test_a_decode_step_short_of_blocks_retracts_the_request_with_the_fewest_tokens() -> None:
    """32 blocks; `a` and `b` each grow to 17 blocks, `c` waits. `b`, one token behind, is
    retracted: it holds nothing, goes before `c`, re-prefills its reply, and emits each of its
    tokens exactly once."""
    core = engine()
    run = Run(core)
    core.submit(sub("a", 1))
    run.step()
    core.submit(sub("b", 2))
    run.step()
    core.submit(sub("c", 3))
    while (step := run.step()) is not None and not step.retracted:
        pass
    assert step is not None and step.retracted == ("b",)
    assert "b" not in step.emitted and "a" in step.emitted
    assert core.queue == ("b", "c")
    b_before = run.emitted["b"]
    # Only `a` holds blocks: its prompt and reply but the last token (4 + 61 tokens).
    assert core.stats().used_blocks == -(-(4 + run.emitted["a"] - 1) // 4)
    resumed = run.step()
    assert resumed is not None and "b" in resumed.emitted and not resumed.admitted
    assert resumed.prefill_tokens >= b_before  # its reply so far is computed again
    run.drain()
    assert run.emitted == {"a": 62, "b": 62, "c": 62}
    stats = core.stats()
    assert (stats.retracted_total, stats.admitted_total, stats.generation_tokens_total) == (
        1,
        3,
        186,
    )
    assert core.idle and core.cache.used == 0


def test_a_retracted_request_keeps_its_prompt_cached_and_drops_its_reply() -> None:
    # As SGLang: the prompt went into the radix tree after its prefill and stays there,
    # unreferenced; the reply was never inserted and is freed.
    core = engine()
    run = Run(core)
    core.submit(sub("a", 1, 8))
    run.step()
    core.submit(sub("b", 2, 8))
    while (step := run.step()) is not None and not step.retracted:
        pass
    assert step is not None and step.retracted == ("b",)
    keys = block_hashes(sub("b", 2, 8).prompt, 4)
    assert core.cache.match(keys) == 2
    assert [core.cache.refcount(k) for k in keys] == [0, 0]
    assert core.cache.evictable == 2


def test_the_new_token_ratio_decays_per_decode_step_to_its_minimum() -> None:
    core = engine(kv_tokens=1024)
    run = Run(core)
    assert core.new_token_ratio == 0.7
    ratios = []
    for i in range(14):  # 700 decode steps, one request at a time
        core.submit(sub(f"r{i}", i, out=50))
        while (step := run.step()) is not None:
            assert step.emitted
            ratios.append(core.new_token_ratio)
    assert ratios[0] == pytest.approx(0.7 - DECAY)
    assert ratios[99] == pytest.approx(0.7 - 100 * DECAY)
    assert ratios[650] == ratios[-1] == sglang.MIN_NEW_TOKEN_RATIO
    assert engine("reserve").stats().new_token_ratio == 1.0


def test_a_retraction_resets_the_ratio_from_the_requests_kept() -> None:
    core = engine(kv_tokens=1024, max_running=64)
    run = Run(core)
    for i in range(13):  # the ratio falls to its minimum
        core.submit(sub(f"w{i}", 100 + i, 8, out=50))
        run.drain()
    assert core.new_token_ratio == sglang.MIN_NEW_TOKEN_RATIO
    for i in range(12):
        core.submit(sub(f"r{i}", i, 8, out=100, reserve=200))
    before = dict(run.emitted)
    while (step := run.step()) is not None and not step.retracted:
        before = dict(run.emitted)
    assert step is not None
    kept = list(step.emitted)
    expected = (sum(before.get(rid, 0) for rid in kept) + 20 * len(kept)) / (200 * len(kept) + 1)
    assert core.new_token_ratio == pytest.approx(expected)
    assert 0.098 < core.new_token_ratio < 1.0
    run.drain()
    assert all(run.emitted[f"r{i}"] == 100 for i in range(12))


def test_a_priority_preemption_counts_the_victims_ratio_share_as_freed() -> None:
    # 32 blocks. `low` holds 1 block and is expected to need 0.7 * 99 more tokens: the urgent
    # head (cost 108) fits only once `low` is gone. `low` resumes and completes its reply.
    core = engine(priority_order="low-first", preempt_threshold=10)
    run = Run(core)
    core.submit(
        Submission(rid="low", prompt=(1, 2, 3, 4), reserve=100, output_tokens=100, priority=50)
    )
    run.step()
    core.submit(Submission(rid="urgent", prompt=(5, 6, 7, 8), reserve=100, output_tokens=100))
    step = run.step()
    assert step is not None and [a.rid for a in step.admitted] == ["urgent"]
    assert core.stats().preempted_total == 1 and core.queue == ("low",)
    run.drain()
    assert run.emitted == {"low": 100, "urgent": 100}
    assert core.idle and core.cache.used == 0


def test_a_request_whose_cost_can_never_fit_is_refused() -> None:
    core = engine()  # 128 tokens: cost 4 + 120 + 4 is not below it
    with pytest.raises(RequestTooLarge):
        core.submit(sub("big", 1, out=120))
    core.submit(sub("fits", 1, out=119))
    with pytest.raises(ValueError, match="admission"):
        EngineParams(admission="eager")  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(
            st.integers(0, 3),  # prompt tag (shared prefixes)
            st.integers(1, 8),  # prompt tokens
            st.one_of(st.just(0), st.integers(30, 150)),  # long replies retract often
            st.integers(0, 2),  # reserved beyond the output
            st.sampled_from([0, 50]),  # priority
        ),
        min_size=3,
        max_size=14,
    ),
    arrive=st.lists(st.integers(0, 4), min_size=14, max_size=14),
    abort_at=st.lists(st.tuples(st.integers(0, 13), st.integers(0, 200)), max_size=3),
    preempt=st.booleans(),
    warm=st.booleans(),
)
def test_sglang_mode_keeps_the_pool_whole_and_every_request_emits_exactly_its_tokens(
    reqs: list[tuple[int, int, int, int, int]],
    arrive: list[int],
    abort_at: list[tuple[int, int]],
    preempt: bool,
    warm: bool,
) -> None:
    """Invariants after every step: free + private + cached == total; the batch stays within
    max_running; a request never emits more than its output tokens. At the end, every request
    not aborted emitted exactly its output tokens and the engine holds nothing. A warm engine
    has run 600 decode steps first: its ratio is at the minimum, so it admits boldly."""
    kw: dict[str, Any] = dict(kv_tokens=200, max_running=6)
    if preempt:
        kw |= dict(priority_order="low-first", preempt_threshold=10)
    core = engine(**kw)
    run = Run(core)
    for i in range(4 if warm else 0):
        core.submit(sub(f"warm{i}", 9, out=150))
        run.drain()
    aborts = {f"r{i}": at for i, at in abort_at if i < len(reqs)}
    pending = sorted(range(len(reqs)), key=lambda i: arrive[i])
    for n_step in range(20_000):
        while pending and arrive[pending[0]] <= n_step:
            i = pending.pop(0)
            tag, n, out, extra, prio = reqs[i]
            tokens = tuple(tag * 1000 + j for j in range(n))
            history = tokens + tuple(tag * 1000 + 500 + j for j in range(out))
            core.submit(
                Submission(
                    rid=f"r{i}",
                    prompt=tokens,
                    reserve=out + extra,
                    output_tokens=out,
                    history=history,
                    priority=prio,
                )
            )
        for rid, at in aborts.items():
            if at == n_step:
                core.abort(rid)
        step = run.step()
        cache = core.cache
        assert cache.free + cache.private + cache.cached == cache.total
        assert 0 <= cache.used <= cache.total
        assert core.stats().running <= 6
        for i, (_, _, out, _, _) in enumerate(reqs):
            assert run.emitted.get(f"r{i}", 0) <= out
        if step is None and not pending:
            break
    assert core.idle and core.cache.used == 0
    event("retracted" if core.stats().retracted_total else "no retraction")
    for i, (_, _, out, _, _) in enumerate(reqs):
        if f"r{i}" not in aborts:
            assert run.emitted.get(f"r{i}", 0) == out
