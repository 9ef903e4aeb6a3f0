"""`luftpause fake-engine`: run one simulated inference engine replica.

Shell layer: parses the command line into `SimParams` and serves (uvloop) until SIGINT/SIGTERM.
`--profile` (cpu or gpu, see `params.PROFILES`) picks the defaults of the engine's flags; a flag
given on the command line, or its `LUFTPAUSE_*` variable, beats the profile. Logs go through
the shared structlog setup (`LUFTPAUSE_LOG_LEVEL`, `LUFTPAUSE_LOG_FORMAT`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import sys
from collections.abc import Mapping

from luftpause.common import envargs
from luftpause.common.logs import setup_logging
from luftpause.common.runner import run_async
from luftpause.testkit.engine.kvcache import EVICTIONS
from luftpause.testkit.engine.params import (
    ADMISSIONS,
    CHARGES,
    CHUNKED_PREFILLS,
    CPU_PROFILE,
    METRIC_NAMES,
    PROFILES,
    TOOL_STYLES,
    EngineParams,
    Profile,
    SimParams,
)
from luftpause.testkit.engine.ratelimit import REGIMES
from luftpause.testkit.engine.ratelimit_headers import HEADER_FAMILIES
from luftpause.testkit.engine.scripted import Script, ScriptError, load_script
from luftpause.testkit.engine.server import serve, server_tls_context
from luftpause.testkit.engine.tokens import GRANULARITIES

_S = SimParams()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _profile_arg(p: argparse.ArgumentParser, default: str) -> None:
    about = "; ".join(f"{name}: {profile.about}" for name, profile in PROFILES.items())
    p.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        default=default,
        help=f"the engine flags' defaults ({about}); flags given beat it",
    )


def build_parser(profile: Profile = CPU_PROFILE) -> argparse.ArgumentParser:
    """The options, their engine defaults from `profile`."""
    e = profile.engine
    p = argparse.ArgumentParser(
        prog="luftpause fake-engine",
        description="A simulated continuous-batching inference engine (OpenAI-compatible).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _profile_arg(p, profile.name)
    add = p.add_argument
    add("--host", default="127.0.0.1", help="address to listen on")
    add("--port", type=int, default=9001, help="port to listen on (0 picks one)")
    add("--id", dest="replica_id", default=_S.replica_id, help="replica id (system_fingerprint)")
    add("--model", default=_S.model, help="model name listed by /v1/models")
    add("--kind", choices=("generative", "single-pass"), default=_S.kind, help="engine kind")
    add("--kv-tokens", type=int, default=e.kv_tokens, help="KV pool size in tokens")
    add("--block-size", type=int, default=e.block_size, help="tokens per KV block")
    add("--max-running", type=int, default=e.max_running, help="cap on the running batch")
    add(
        "--max-prefill-tokens",
        type=int,
        default=e.max_prefill_tokens,
        help="uncached prompt tokens admitted per iteration (the first request always fits)",
    )
    add(
        "--prefill-ms-per-token",
        type=float,
        default=e.prefill_ms_per_token,
        help="prefill cost per uncached prompt token",
    )
    add("--decode-base-ms", type=float, default=e.decode_base_ms, help="fixed decode step cost")
    add(
        "--decode-ms-per-seq",
        type=float,
        default=e.decode_ms_per_seq,
        help="decode step cost per running sequence",
    )
    add(
        "--priority-scheduling",
        choices=("off", "low-first", "high-first"),
        default=e.priority_order,
        help="order the waiting queue by the request's `priority` (vLLM: low-first)",
    )
    add(
        "--priority-preemption-threshold",
        type=int,
        default=e.preempt_threshold,
        metavar="N",
        help="with --priority-scheduling: a waiting request that cannot start preempts running "
        "ones whose priority is worse by more than N, as SGLang does (its default: 10); "
        "unset: never preempt, as vLLM",
    )
    add(
        "--admission",
        choices=ADMISSIONS,
        default=e.admission,
        help="reserve: a request starts when blocks for its prompt and whole max_tokens fit; "
        "sglang: SGLang's admission (running replies counted at new_token_ratio, reply blocks "
        "on demand, retraction when a decode step runs out); ondemand: when its prompt and its "
        "reply reserve fit what is free now, replies growing on demand, the latest admitted "
        "giving way when they run out (vLLM)",
    )
    _family_args(p, e)
    add(
        "--stream-interval",
        type=_positive_int,
        default=profile.stream_interval,
        metavar="N",
        help="streamed replies: the first token at once, then one SSE chunk per N tokens "
        "(SGLang's --stream-interval)",
    )
    add(
        "--time-scale",
        type=float,
        default=_S.time_scale,
        help="simulated time runs this many times faster than real time",
    )
    add(
        "--tool-rounds",
        type=int,
        default=_S.tool_rounds,
        help="tool calls before a final answer (header x-sim-tool-rounds overrides)",
    )
    add(
        "--tool-style",
        choices=TOOL_STYLES,
        default=_S.tool_style,
        help="openai: tool_calls while tools are offered; text: a <tool_call> block in the "
        "content, finish reason stop (header x-sim-tool-style overrides)",
    )
    add("--reply-tokens", type=int, default=_S.reply_tokens, help="tokens in a final answer")
    add(
        "--default-max-tokens",
        type=int,
        default=_S.default_max_tokens,
        help="reply tokens reserved when a request sets no max_tokens",
    )
    add("--labels", default=",".join(_S.labels), help="single-pass labels, comma-separated")
    add(
        "--context-window",
        type=_positive_int,
        default=_S.context_window,
        metavar="N",
        help="the context window in tokens: a prompt plus max_tokens longer than N gets a 400 "
        "context_length_exceeded; /v1/models says it as max_model_len (unset: no limit but the "
        "KV pool)",
    )
    _rate_limit_args(p)
    add("--require-key", default=None, help="answer 401 unless Authorization: Bearer KEY")
    add(
        "--slot-saves",
        action="store_true",
        help="answer llama.cpp's POST /slots/{id}?action=save|restore (its --slot-save-path); "
        "off: 501 as llama.cpp without it",
    )
    add(
        "--script",
        metavar="FILE",
        default=None,
        help="a script of replies (YAML or JSON, see testkit/engine/scripted.py): the tool "
        "calls and answers the model gives a harness's session, turn by turn",
    )
    add("--tls-cert", metavar="FILE", default=None, help="serve https: PEM certificate chain")
    add("--tls-key", metavar="FILE", default=None, help="serve https: PEM private key")
    return p


def _family_args(p: argparse.ArgumentParser, e: EngineParams) -> None:
    """Where engines differ: reply reserve, prefix cache, eviction, chunked prefill, metrics."""
    add = p.add_argument
    add(
        "--reply-reserve",
        type=float,
        default=e.reply_reserve,
        help="ondemand: the share of its reply reserve a waiting request must find free beside "
        "its prompt (1: all; 0: the prompt alone)",
    )
    add(
        "--reserve-cap",
        type=_positive_int,
        default=e.reserve_cap,
        metavar="N",
        help="ondemand: a request's reply reserve is min(max_tokens, N) (unset: max_tokens)",
    )
    add(
        "--prefix-cache",
        choices=GRANULARITIES,
        default=e.prefix_cache,
        help="block: every full block is keyed (vLLM); message: every message, rounded down to "
        "whole blocks (a radix tree cut at messages); none: nothing is shared",
    )
    add(
        "--eviction",
        choices=EVICTIONS,
        default=e.eviction,
        help="which unreferenced prefix goes first: least recently released (lru) or least "
        "recently cached (fifo)",
    )
    add(
        "--chunked-prefill",
        choices=CHUNKED_PREFILLS,
        default=e.chunked_prefill,
        help="off: a prompt is computed whole with the decode step; mixed: in chunks beside the "
        "decode step (vLLM); separate: in chunks in iterations of their own, the batch waiting "
        "(SGLang)",
    )
    add(
        "--chunk-tokens",
        type=_positive_int,
        default=e.chunk_tokens,
        metavar="N",
        help="chunked prefill: prompt tokens per iteration (mixed: less one per decoding request)",
    )
    add(
        "--metrics",
        choices=METRIC_NAMES,
        default=None,
        help="metric names on /metrics: both engines', sglang's, vllm's, llama.cpp's request "
        "counts only (no KV figures), or a hosted API's: none (the default with a rate limit; "
        f"else {_S.metrics})",
    )
    add(
        "--no-server-info",
        dest="server_info",
        action="store_false",
        help="answer 404 to SGLang's /server_info, as vLLM and llama.cpp do",
    )


def _rate_limit_args(p: argparse.ArgumentParser) -> None:
    """The hosted-API mode: budgets, how they refill, what a request costs, which headers."""
    add = p.add_argument
    add("--rpm", type=int, default=None, help="hosted-API mode: requests per window")
    add("--tpm", type=int, default=None, help="hosted-API mode: tokens per window")
    add("--itpm", type=int, default=None, help="hosted-API mode: input tokens per window")
    add("--otpm", type=int, default=None, help="hosted-API mode: output tokens per window")
    add(
        "--rate-window-s",
        "--rate-limit-window-s",
        type=float,
        default=_S.rate_window_s,
        help="rate-limit window in simulated seconds",
    )
    add(
        "--rate-limit-regime",
        choices=REGIMES,
        default=_S.rate_limit_regime,
        help="fixed: budgets whole again at each window boundary; continuous: token buckets "
        "refilling limit/window per second (OpenAI)",
    )
    add(
        "--rate-limit-charge",
        choices=CHARGES,
        default=_S.rate_limit_charge,
        help="a chat request's output tokens charged at its start: max_tokens (OpenAI's "
        "estimate) or usage (the reply it will generate)",
    )
    add(
        "--rate-limit-headers",
        choices=HEADER_FAMILIES,
        default=_S.rate_limit_headers,
        help="openai: x-ratelimit-* with durations; anthropic: anthropic-ratelimit-* with "
        "RFC 3339 resets; none: only a 429's Retry-After",
    )


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Options from argv and the environment, the defaults from the profile they name."""
    env = os.environ if environ is None else environ
    first = argparse.ArgumentParser(prog="luftpause fake-engine", add_help=False)
    _profile_arg(first, CPU_PROFILE.name)
    chosen, _ = envargs.parse_known_args(first, argv, env)
    return envargs.parse_args(build_parser(PROFILES[chosen.profile]), argv, env)


def _hosted(args: argparse.Namespace) -> bool:
    """The hosted-API mode: some budget is limited."""
    return any(getattr(args, name) is not None for name in ("rpm", "tpm", "itpm", "otpm"))


def params_from(args: argparse.Namespace) -> SimParams:
    engine = EngineParams(
        kv_tokens=args.kv_tokens,
        block_size=args.block_size,
        max_running=args.max_running,
        max_prefill_tokens=args.max_prefill_tokens,
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_base_ms=args.decode_base_ms,
        decode_ms_per_seq=args.decode_ms_per_seq,
        priority_order=args.priority_scheduling,
        preempt_threshold=args.priority_preemption_threshold,
        admission=args.admission,
        reply_reserve=args.reply_reserve,
        reserve_cap=args.reserve_cap,
        prefix_cache=args.prefix_cache,
        eviction=args.eviction,
        chunked_prefill=args.chunked_prefill,
        chunk_tokens=args.chunk_tokens,
    )
    return SimParams(
        engine=engine,
        replica_id=args.replica_id,
        model=args.model,
        kind=args.kind,
        time_scale=args.time_scale,
        tool_rounds=args.tool_rounds,
        tool_style=args.tool_style,
        reply_tokens=args.reply_tokens,
        default_max_tokens=args.default_max_tokens,
        labels=tuple(x.strip() for x in args.labels.split(",") if x.strip()),
        rpm=args.rpm,
        tpm=args.tpm,
        itpm=args.itpm,
        otpm=args.otpm,
        rate_window_s=args.rate_window_s,
        rate_limit_regime=args.rate_limit_regime,
        rate_limit_charge=args.rate_limit_charge,
        rate_limit_headers=args.rate_limit_headers,
        require_key=args.require_key,
        slot_saves=args.slot_saves,
        stream_interval=args.stream_interval,
        context_window=args.context_window,
        metrics=args.metrics or ("hosted" if _hosted(args) else _S.metrics),
        server_info=args.server_info,
    )


async def _serve_until(
    stop: asyncio.Event,
    params: SimParams,
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
    script: Script | None,
) -> None:
    log = setup_logging("fake-engine")
    server = await serve(params, host, port, tls=tls, script=script)
    log.info(
        "listening",
        url=server.url,
        replica=params.replica_id,
        time_scale=params.time_scale,
        kind=params.kind,
    )
    try:
        await stop.wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of `luftpause fake-engine`."""
    argv = sys.argv[1:] if argv is None else argv  # as the console script calls it
    args = parse_args(argv)
    parser = build_parser(PROFILES[args.profile])
    try:
        params = params_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    tls: ssl.SSLContext | None = None
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_cert is not None:
        try:
            tls = server_tls_context(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            parser.error(f"cannot load the TLS certificate or key: {exc}")
    try:
        script = None if args.script is None else load_script(args.script)
    except ScriptError as exc:
        parser.error(str(exc))
    return run_async(
        lambda stop: _serve_until(stop, params, args.host, args.port, tls, script),
        name="fake-engine",
    )
