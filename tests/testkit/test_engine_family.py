"""The engine simulator as a family: where engines differ (admission, prefix-cache granularity,
eviction order, chunked prefill, what the metrics say), each knob doing what it says.

No event loop: steps are driven by hand with simulated time.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.scheduler.engine_load import parse_load
from luftpause.testkit.engine.core import EngineCore, Step, Submission
from luftpause.testkit.engine.metrics import ShellCounters, render
from luftpause.testkit.engine.params import EngineParams
from luftpause.testkit.engine.tokens import prefix_keys, render_parts, tokenize


def engine(**kw: Any) -> EngineCore:
    base: dict[str, Any] = dict(
        kv_tokens=256,
        block_size=4,
        max_running=8,
        prefill_ms_per_token=1.0,
        decode_base_ms=10.0,
        decode_ms_per_seq=2.0,
    )
    return EngineCore(EngineParams(**{**base, **kw}))


def tokens(tag: int, n: int) -> tuple[int, ...]:
    return tuple(tag * 1000 + i for i in range(n))


def sub(rid: str, prompt: tuple[int, ...], out: int = 1, **kw: Any) -> Submission:
    return Submission(
        rid=rid, prompt=prompt, reserve=kw.pop("reserve", out), output_tokens=out, **kw
    )


class Drive:
    """Steps a core one iteration after another and records what each request emitted."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.now = 0.0
        self.emitted: dict[str, int] = {}
        self.steps: list[Step] = []

    def step(self) -> Step | None:
        step = self.core.step(self.now)
        if step is not None:
            self.now = step.ends_at
            self.steps.append(step)
            for rid in step.emitted:
                self.emitted[rid] = self.emitted.get(rid, 0) + 1
        return step

    def drain(self) -> list[Step]:
        out = []
        while (step := self.step()) is not None:
            out.append(step)
        return out


# --- prefix-cache granularity ---------------------------------------------------------------


def test_message_keys_end_at_message_boundaries_rounded_down_to_whole_blocks() -> None:
    toks = list(range(100))
    keys, ends = prefix_keys(toks, (10, 11, 40, 95), "message", 4)
    assert ends == [2, 10, 23]  # 10 -> 2 blocks; 11 -> still 2 (joins the next); 40; 95 -> 23
    assert len(keys) == 3
    assert prefix_keys(toks, (10, 40), "none", 4) == ([], [])
    _, block_ends = prefix_keys(toks, (), "block", 4)
    assert block_ends == list(range(1, 26))


def test_the_message_cuts_of_a_conversation_extend_as_it_grows() -> None:
    first = [{"role": "system", "content": "s" * 50}, {"role": "user", "content": "u" * 70}]
    grown = [*first, {"role": "assistant", "content": "a" * 30}, {"role": "user", "content": "x"}]
    text1, cuts1 = render_parts(first, None)
    text2, cuts2 = render_parts(grown, None)
    assert cuts2[: len(cuts1)] == cuts1
    keys1, _ = prefix_keys(tokenize(text1), cuts1, "message", 1)
    keys2, _ = prefix_keys(tokenize(text2), cuts2, "message", 1)
    assert keys2[: len(keys1)] == keys1


def test_a_message_cache_serves_whole_messages_only_where_a_block_cache_serves_blocks() -> None:
    """Two prompts share 30 tokens; the first message ends at 20. A block cache serves the 28
    shared tokens of whole blocks, a message cache the 20 of the first message."""
    shared = tokens(1, 30)
    first = (*shared, *tokens(2, 10))
    second = (*shared, *tokens(3, 10))
    cached = {}
    for granularity in ("block", "message", "none"):
        core = engine(prefix_cache=granularity)
        drive = Drive(core)
        core.submit(sub("a", first, prompt_cuts=(20, 40)))
        drive.drain()
        core.submit(sub("b", second, prompt_cuts=(20, 40)))
        step = drive.step()
        assert step is not None
        cached[granularity] = step.admitted[0].cached_tokens
    assert cached == {"block": 28, "message": 20, "none": 0}


def test_a_message_cache_serves_the_reply_as_a_message_of_the_follow_up() -> None:
    core = engine(prefix_cache="message", block_size=1)
    drive = Drive(core)
    prompt = tokens(1, 40)
    history = (*prompt, *tokens(9, 12))
    core.submit(
        sub("a", prompt, out=8, prompt_cuts=(25, 38), history=history, history_cuts=(25, 38, 52))
    )
    drive.drain()
    follow = (*history, *tokens(5, 6))
    core.submit(sub("b", follow, prompt_cuts=(25, 38, 52, 58)))
    step = drive.step()
    assert step is not None and step.admitted[0].cached_tokens == 52


# --- eviction order -------------------------------------------------------------------------


def test_fifo_evicts_the_oldest_cached_prefix_even_when_it_was_used_last() -> None:
    """Pool of 16 blocks: p1 (3 blocks) then p2 (3) cached, p1 used again; a 13-block request
    evicts one prefix: lru takes p2 (released earlier), fifo takes p1 (cached earlier)."""
    survivors = {}
    for eviction in ("lru", "fifo"):
        core = engine(kv_tokens=64, eviction=eviction)
        drive = Drive(core)
        p1, p2 = tokens(1, 13), tokens(2, 13)
        for rid, prompt in (("x", p1), ("y", p2), ("x2", p1)):
            core.submit(sub(rid, prompt, out=1, reserve=3))
            drive.drain()
        core.submit(sub("big", tokens(3, 48), out=1, reserve=4))
        drive.drain()
        survivors[eviction] = [
            name
            for name, p in (("p1", p1), ("p2", p2))
            if core.cache.match(prefix_keys(p, (), "block", 4)[0]) > 0
        ]
    assert survivors == {"lru": ["p1"], "fifo": ["p2"]}


# --- admission ------------------------------------------------------------------------------


def test_ondemand_admits_on_the_prompt_and_a_capped_reserve_and_lets_replies_grow() -> None:
    """Each request: 8-token prompt (2 blocks), max_tokens 200. Reserving whole replies fits one
    at a time in 64 blocks; ondemand with a 16-token reserve cap admits while 2 + 4 blocks are
    free, so many run at once; every request still emits all its tokens."""

    def most_running(**kw: Any) -> tuple[int, Drive]:
        core = engine(kv_tokens=256, max_running=32, **kw)
        drive = Drive(core)
        for i in range(12):
            core.submit(sub(f"r{i}", tokens(i, 8), out=30, reserve=200))
        most = 0
        while drive.step() is not None:
            most = max(most, core.stats().running)
        return most, drive

    reserving, _ = most_running()
    capped, drive = most_running(admission="ondemand", reserve_cap=16)
    assert reserving == 1
    assert capped >= 6
    assert drive.emitted == {f"r{i}": 30 for i in range(12)}


def test_ondemand_holds_the_head_until_its_prompt_and_reserve_fit_first_come_first_served() -> None:
    core = engine(kv_tokens=64, admission="ondemand", reserve_cap=16)  # 16 blocks
    drive = Drive(core)
    core.submit(sub("a", tokens(1, 44), out=4, reserve=100))  # 11 blocks, its reply grows
    drive.step()
    core.submit(sub("b", tokens(2, 8), out=1, reserve=100))  # 2 + 4: does not fit beside a
    core.submit(sub("c", tokens(3, 1), out=1, reserve=1))  # would fit, but waits behind b
    step = drive.step()
    assert step is not None and not step.admitted
    assert core.queue == ("b", "c")
    drive.drain()
    assert drive.emitted == {"a": 4, "b": 1, "c": 1}


def test_ondemand_retracts_the_latest_admitted_when_replies_run_out_of_blocks() -> None:
    core = engine(kv_tokens=64, admission="ondemand", reply_reserve=0.0)  # prompts alone
    drive = Drive(core)
    for i in range(3):
        core.submit(sub(f"r{i}", tokens(i, 8), out=30, reserve=30))
    retracted: list[str] = []
    for step in drive.drain():
        retracted += step.retracted
    assert retracted and retracted[0] == "r2"
    assert drive.emitted == {f"r{i}": 30 for i in range(3)}
    assert core.idle and core.cache.used == 0


# --- chunked prefill ------------------------------------------------------------------------


def test_separate_chunked_prefill_computes_a_long_prompt_in_chunks_that_stall_decoding() -> None:
    core = engine(kv_tokens=1024, chunked_prefill="separate", chunk_tokens=16)
    drive = Drive(core)
    core.submit(sub("a", tokens(1, 4), out=20))
    drive.step()
    drive.step()
    assert drive.emitted["a"] == 2
    core.submit(sub("b", tokens(2, 40), out=2))  # 40 tokens: three prefill passes
    passes = [drive.step() for _ in range(3)]
    assert [s.prefill_tokens for s in passes if s] == [16, 16, 8]
    assert [s.emitted for s in passes if s] == [(), (), ("b",)]  # a waits; b's first token
    assert [s.duration_ms for s in passes if s] == [16.0, 16.0, 8.0]
    nxt = drive.step()
    assert nxt is not None and set(nxt.emitted) == {"a", "b"}


def test_mixed_chunked_prefill_keeps_the_batch_decoding_beside_the_chunks() -> None:
    core = engine(kv_tokens=1024, chunked_prefill="mixed", chunk_tokens=17)
    drive = Drive(core)
    core.submit(sub("a", tokens(1, 4), out=20))
    drive.step()
    core.submit(sub("b", tokens(2, 40), out=2))
    steps = [drive.step() for _ in range(3)]
    # 17 tokens a step, one of them a's decode: 16 of b's prompt per step.
    assert [s.prefill_tokens for s in steps if s] == [16, 16, 8]
    assert all("a" in s.emitted for s in steps if s)
    assert [("b" in s.emitted) for s in steps if s] == [False, False, True]
    first = steps[0]
    assert first is not None and first.duration_ms == 16 + 10 + 2 * 1


def test_chunked_prefill_admits_only_while_a_chunk_of_prompt_is_not_yet_waiting() -> None:
    core = engine(kv_tokens=1024, chunked_prefill="separate", chunk_tokens=16)
    drive = Drive(core)
    for i in range(4):
        core.submit(sub(f"r{i}", tokens(i, 12), out=1))
    first = drive.step()
    assert first is not None and [a.rid for a in first.admitted] == ["r0", "r1"]  # 12 < 16
    drive.drain()
    assert drive.emitted == {f"r{i}": 1 for i in range(4)}


@settings(max_examples=80, deadline=None)
@given(
    admission=st.sampled_from(["reserve", "sglang", "ondemand"]),
    prefix_cache=st.sampled_from(["block", "message", "none"]),
    eviction=st.sampled_from(["lru", "fifo"]),
    chunked=st.sampled_from(["off", "mixed", "separate"]),
    chunk=st.integers(4, 64),
    reserve=st.floats(0.0, 1.0),
    reqs=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(0, 12), st.integers(0, 6)),
        min_size=1,
        max_size=10,
    ),
)
def test_every_engine_of_the_family_keeps_the_pool_whole_and_emits_exactly_each_reply(
    admission: str,
    prefix_cache: str,
    eviction: str,
    chunked: str,
    chunk: int,
    reserve: float,
    reqs: list[tuple[int, int, int, int]],
) -> None:
    """Invariants for any engine of the family: free + private + cached == total; every
    request emits exactly its output tokens; an idle engine holds nothing but cache."""
    core = engine(
        kv_tokens=160,
        admission=admission,
        prefix_cache=prefix_cache,
        eviction=eviction,
        chunked_prefill=chunked,
        chunk_tokens=chunk,
        reply_reserve=reserve,
    )
    drive = Drive(core)
    for i, (tag, n, out, extra) in enumerate(reqs):
        prompt = (*tokens(tag, n // 2), *tokens(i + 10, n - n // 2))
        history = (*prompt, *tokens(i + 50, out))
        core.submit(
            Submission(
                rid=f"r{i}",
                prompt=prompt,
                reserve=out + extra,
                output_tokens=out,
                history=history,
                prompt_cuts=(n // 2, n),
                history_cuts=(n // 2, n, n + out),
            )
        )
    for _ in range(20_000):
        step = drive.step()
        cache = core.cache
        assert cache.free + cache.private + cache.cached == cache.total
        assert 0 <= cache.evictable <= cache.cached
        if step is None:
            break
    assert core.idle and core.cache.used == 0
    for i, (_, _, out, _) in enumerate(reqs):
        assert drive.emitted.get(f"r{i}", 0) == out


# --- what an engine tells ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "pool"),
    [("both", 256), ("sglang", 256), ("vllm", 256), ("llamacpp", None)],
)
def test_each_engine_kind_exports_its_own_metric_names(names: str, pool: int | None) -> None:
    core = engine()
    core.submit(sub("a", tokens(1, 8), out=5))
    Drive(core).step()
    shell = ShellCounters(
        requests_total=1,
        rate_limited_total=0,
        rejected_total=0,
        steps_total=1,
        busy_ms_total=1.0,
        lag_seconds=0.0,
    )
    text = render(core.stats(), shell, model="m", replica="e", names=names)
    families = {line.split(":", 1)[0] for line in text.splitlines() if ":" in line.split(" ")[0]}
    expected = {"both": {"sglang", "vllm"}, "llamacpp": {"llamacpp"}}.get(names, {names})
    assert {f for f in families if not f.startswith("#")} == expected
    load = parse_load(text)
    assert load is not None and load.running == 1 and load.kv_total == pool


def test_fifo_skips_referenced_entries_and_its_order_stays_bounded() -> None:
    """An entry still referenced is passed over, the next oldest goes; a key referenced and
    released many times does not grow the eviction order without bound."""
    from luftpause.testkit.engine.kvcache import PrefixCache

    cache = PrefixCache(4, eviction="fifo")
    for key in (1, 2, 3):
        cache.allocate((), 1)
        cache.publish((key,))
    cache.release((2, 3), 0)  # 1 stays referenced
    for _ in range(1000):
        cache.allocate((3,), 0)
        cache.release((3,), 0)
    assert len(cache._heap) <= 2 * 3 + 64
    cache.allocate((), 2)  # one free block, then one eviction: 2, the oldest unreferenced
    assert (cache.refcount(1), cache.refcount(2), cache.refcount(3)) == (1, -1, 0)
