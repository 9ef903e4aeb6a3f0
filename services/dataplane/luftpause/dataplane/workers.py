"""`luftpause dataplane --workers N`: N dataplane processes sharing one port, supervised.

Shell module. One dataplane is one event loop, so it uses one core; a pod or host with more
cores runs several. Each worker is a whole dataplane (`luftpause dataplane --workers 1`) with
its own id (`<id>-<k>`) and its own Report stream to the scheduler, bound with SO_REUSEPORT to the
same address, so the kernel spreads incoming connections over them. A run's turns may then
arrive at different workers; the scheduler tracks each worker as a dataplane of its own and
tells one that lost a run to another (`RunTaken`), as with several dataplanes behind a load
balancer.

The parent only supervises: it forwards SIGINT and SIGTERM to the workers and waits for them;
a worker that exits while the parent is not stopping is started again after RESTART_DELAY_S,
and one that keeps dying within QUICK_EXIT_S of its start (a port in use, a bad option) makes
the parent stop the others and exit 1 after GIVE_UP_AFTER tries.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Sequence

import structlog

RESTART_DELAY_S = 1.0
QUICK_EXIT_S = 2.0
GIVE_UP_AFTER = 5
STOP_TIMEOUT_S = 15.0

log = structlog.get_logger("luftpause.dataplane.workers")


def worker_argv(argv: Sequence[str], dataplane_id: str, index: int) -> list[str]:
    """A worker's command line: the parent's options, one worker, its own id, a shared port."""
    return [
        sys.executable,
        "-m",
        "luftpause.dataplane",
        *argv,
        "--workers",
        "1",
        "--reuse-port",
        "--id",
        f"{dataplane_id}-{index}",
    ]


class Supervisor:
    """Starts the workers, restarts the ones that die, stops them all on a signal."""

    def __init__(self, argv: Sequence[str], dataplane_id: str, workers: int) -> None:
        self.argv = list(argv)
        self.dataplane_id = dataplane_id
        self.workers = workers
        self.stopping = asyncio.Event()
        self._procs: dict[int, asyncio.subprocess.Process] = {}

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stopping.set)
        results = await asyncio.gather(*(self._keep(k) for k in range(self.workers)))
        return max(results)

    async def _keep(self, index: int) -> int:
        """Keep worker `index` running until the supervisor stops; its exit code then."""
        quick = 0
        while True:
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                *worker_argv(self.argv, self.dataplane_id, index)
            )
            self._procs[index] = proc
            log.info("dataplane worker started", worker=index, pid=proc.pid)
            code = await self._wait(proc)
            if self.stopping.is_set():
                return 0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else 1
            quick = quick + 1 if time.monotonic() - started < QUICK_EXIT_S else 0
            log.warning("dataplane worker exited", worker=index, code=code, quick_exits=quick)
            if quick >= GIVE_UP_AFTER:
                log.error("dataplane worker keeps failing at start; stopping", worker=index)
                self.stopping.set()
                return 1
            try:
                async with asyncio.timeout(RESTART_DELAY_S):
                    await self.stopping.wait()
                return 0
            except TimeoutError:
                continue

    async def _wait(self, proc: asyncio.subprocess.Process) -> int:
        """The worker's exit code; on stop, SIGTERM it (SIGKILL past STOP_TIMEOUT_S)."""
        exited = asyncio.create_task(proc.wait())
        stop = asyncio.create_task(self.stopping.wait())
        await asyncio.wait((exited, stop), return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await exited
            except TimeoutError:
                proc.kill()
                await exited
        stop.cancel()
        return exited.result()
