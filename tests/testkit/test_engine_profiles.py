"""`luftpause fake-engine --profile cpu|gpu`: the engine flags' defaults, which flags beat."""

from __future__ import annotations

import asyncio

from openai import AsyncOpenAI

from luftpause.testkit.engine.main import params_from, parse_args
from luftpause.testkit.engine.params import (
    CALIBRATED_DECODE_BASE_MS,
    CPU_PROFILE,
    GPU_PROFILE,
    EngineParams,
    SimParams,
)
from luftpause.testkit.engine.server import serve
from luftpause.testkit.waits import read_metrics


def test_cpu_is_the_calibrated_default() -> None:
    assert params_from(parse_args([], {})) == SimParams()
    assert params_from(parse_args(["--profile", "cpu"], {})) == SimParams()
    assert CPU_PROFILE.engine == EngineParams()
    assert CPU_PROFILE.engine.decode_base_ms == CALIBRATED_DECODE_BASE_MS


def test_gpu_is_a_small_sglang_like_engine() -> None:
    engine = params_from(parse_args(["--profile", "gpu"], {})).engine
    assert engine == GPU_PROFILE.engine
    assert engine.admission == "sglang"
    assert (engine.prefill_ms_per_token, engine.decode_base_ms, engine.decode_ms_per_seq) == (
        0.1,
        15.0,
        0.3,
    )
    assert (engine.max_running, engine.kv_tokens) == (48, 96000)
    assert params_from(parse_args(["--profile", "gpu"], {})).stream_interval == 1


def test_a_short_turns_first_token_costs_milliseconds_on_the_gpu_profile() -> None:
    # First token of a 200-token prompt: its prefill and one decode step of a batch of one.
    gpu = GPU_PROFILE.engine.step_ms(prefill_tokens=200, decoding=1)
    cpu = CPU_PROFILE.engine.step_ms(prefill_tokens=200, decoding=1)
    assert gpu < 50 < 1000 < cpu


def test_flags_beat_the_profile_and_so_do_their_variables() -> None:
    args = parse_args(["--profile", "gpu", "--max-running", "8", "--admission", "reserve"], {})
    engine = params_from(args).engine
    assert (engine.max_running, engine.admission, engine.kv_tokens) == (8, "reserve", 96000)
    env = {"LUFTPAUSE_PROFILE": "gpu", "LUFTPAUSE_KV_TOKENS": "5000"}
    engine = params_from(parse_args([], env)).engine
    assert (engine.kv_tokens, engine.decode_base_ms) == (5000, 15.0)
    assert params_from(parse_args(["--kv-tokens", "7000"], env)).engine.kv_tokens == 7000


async def test_a_gpu_profile_engine_streams_a_short_turns_first_token_well_under_a_second() -> None:
    params = params_from(parse_args(["--profile", "gpu", "--time-scale", "1"], {}))
    server = await serve(params)
    try:
        async with (
            asyncio.timeout(30),
            AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client,
        ):
            stream = await client.chat.completions.create(
                model=params.model,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                stream=True,
            )
            content = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            metrics = await read_metrics(server.url + "/metrics")
    finally:
        await server.close()
    assert content
    # The engine's own clock (at time scale 1 the time it means to take), not this machine's:
    # the whole short turn, its first token included, takes about 120 ms (the cpu profile 450).
    assert 0 < metrics["luftpause_sim_busy_ms_total"] < 250
