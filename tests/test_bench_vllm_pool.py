"""bench.vllm_pool's pure parts: the KV pool's size, the longest context, the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.vllm_pool import (
    BLOCK_TOKENS,
    GIB,
    KV_GIB,
    MODEL,
    engine_args,
    engine_env,
    kv_bytes_per_token,
    kv_pool_bytes,
    longest_context,
)

# Gemma 3 270M's config.json, the keys the KV size depends on.
GEMMA = {
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "num_attention_heads": 4,
    "head_dim": 256,
    "hidden_size": 640,
}
PER_TOKEN = 18 * 1 * 256 * 2 * 2  # layers x KV heads x head size x (keys, values) x bfloat16


def test_a_token_takes_keys_and_values_of_every_layer_in_bfloat16() -> None:
    assert kv_bytes_per_token(GEMMA) == PER_TOKEN == 18_432
    without_head_dim = {k: v for k, v in GEMMA.items() if k != "head_dim"}
    assert kv_bytes_per_token(without_head_dim) == 18 * 1 * (640 // 4) * 2 * 2


def test_a_pool_in_tokens_is_rounded_up_to_whole_blocks() -> None:
    assert kv_pool_bytes(None, 16_384, PER_TOKEN) == 16_384 * PER_TOKEN
    assert kv_pool_bytes(None, 16_385, PER_TOKEN) == (16_384 + BLOCK_TOKENS) * PER_TOKEN


def test_a_pool_in_gib_is_taken_as_is_and_neither_means_the_default() -> None:
    assert kv_pool_bytes(0.5, None, PER_TOKEN) == GIB // 2
    assert kv_pool_bytes(None, None, PER_TOKEN) == int(KV_GIB * GIB)


@pytest.mark.parametrize(("gib", "tokens"), [(1.0, 1000), (None, 1), (1e-6, None), (-1.0, None)])
def test_a_pool_given_twice_or_too_small_for_two_blocks_is_refused(
    gib: float | None, tokens: int | None
) -> None:
    with pytest.raises(ValueError, match="KV pool"):
        kv_pool_bytes(gib, tokens, PER_TOKEN)


def test_the_longest_context_leaves_vllms_empty_block_out_of_a_small_pool() -> None:
    # vLLM 0.32 refused a 16,384-token context in a 16,384-token pool: it keeps one block empty.
    assert longest_context(16_384 * PER_TOKEN, PER_TOKEN, 16_384) == 16_384 - BLOCK_TOKENS
    assert longest_context(GIB, PER_TOKEN, 16_384) == 16_384


def test_a_replica_caches_prefixes_reports_them_and_keeps_every_layers_kv() -> None:
    args = engine_args(
        9001, model_dir=Path("/m"), kv_pool_bytes=GIB, max_num_seqs=8, max_model_len=4096
    )
    flags = dict(zip(args, [*args[1:], ""], strict=True))
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert flags["--model"] == "/m" and flags["--served-model-name"] == MODEL
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "9001"
    assert flags["--kv-cache-memory-bytes"] == str(GIB) and flags["--max-num-seqs"] == "8"
    assert flags["--tool-call-parser"] == "hermes"
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager"):
        assert flag in args
    assert "--disable-hybrid-kv-cache-manager" in args
    hybrid = engine_args(
        9001, model_dir=Path("/m"), kv_pool_bytes=GIB, max_num_seqs=8, max_model_len=4096,
        hybrid_kv=True, extra=["--seed", "3"],
    )  # fmt: skip
    assert "--disable-hybrid-kv-cache-manager" not in hybrid and hybrid[-2:] == ["--seed", "3"]


def test_a_replica_runs_offline_on_its_own_core() -> None:
    env = engine_env(1)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["HF_HUB_OFFLINE"] == "1"
