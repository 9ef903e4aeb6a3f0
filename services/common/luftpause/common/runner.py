"""Run a service's async main under uvloop until a stop signal.

Shell module. The service gets an `asyncio.Event` set on SIGINT/SIGTERM and is expected to
shut down cleanly once it is set; the process then exits 0.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Iterable

import uvloop


def run_async(
    main: Callable[[asyncio.Event], Awaitable[None]],
    signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
) -> int:
    """Run `main(stop)` on a fresh event loop; return the process exit code."""

    async def _wrapped() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    uvloop.run(_wrapped())
    return 0
