"""Run a service's async main under uvloop until a stop signal.

Shell module. The service gets an `asyncio.Event` set on SIGINT/SIGTERM and is expected to
shut down cleanly once it is set; the process then exits 0. A service that cannot start (its
port is taken, an address does not resolve) exits 1 with one line saying why, not a traceback.
Spans still queued for export (`common.tracing`, if the service set it up) are flushed last.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable

import uvloop

from luftpause.common import tracing


class StartupError(Exception):
    """The service could not start; the message says why, in words for an operator."""


def run_async(
    main: Callable[[asyncio.Event], Awaitable[None]],
    signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
    *,
    name: str = "luftpause",
) -> int:
    """Run `main(stop)` on a fresh event loop; return the process exit code."""

    async def _wrapped() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    try:
        uvloop.run(_wrapped())
    except (StartupError, OSError) as exc:
        print(f"{name}: cannot start: {exc}", file=sys.stderr)
        return 1
    except SystemExit as exc:  # a server library giving up at startup (uvicorn exits 3)
        code = exc.code if isinstance(exc.code, int) else 1
        if code:
            print(f"{name}: could not start (exit {code}); see the log above", file=sys.stderr)
        return code
    finally:
        tracing.shutdown()
    return 0
