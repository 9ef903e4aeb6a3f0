"""bench.engine_watch reads each engine's prefix-cache counters as the engine defines them."""

from __future__ import annotations

from bench.engine_watch import _Series

LLAMA = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {computed}
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total {cached}
"""

SIM = """luftpause_sim_prompt_tokens_total {prompt}
luftpause_sim_cached_tokens_total {cached}
"""


def test_llamacpp_counts_computed_tokens_only_so_its_share_is_of_both() -> None:
    series = _Series()
    series.add(LLAMA.format(computed=1000, cached=0))
    # 1,000 more tokens computed and 3,000 reused: three quarters of the prompts from cache.
    series.add(LLAMA.format(computed=2000, cached=3000))
    assert series.summary()["cache_hit_share"] == 0.75


def test_an_engine_whose_prompt_counter_includes_the_cached_tokens_is_read_as_is() -> None:
    series = _Series()
    series.add(SIM.format(prompt=100, cached=50))
    series.add(SIM.format(prompt=4100, cached=3050))
    assert series.summary()["cache_hit_share"] == 0.75
