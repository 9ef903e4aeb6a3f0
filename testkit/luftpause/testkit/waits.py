"""Bounded waits for tests and benchmarks, and the reads they wait on: a status, a metrics page.

Shell module (network I/O). Every wait is bounded and, when it runs out, fails naming what it
waited for and the last value it saw; the bounds are generous, so a busy machine makes a test
slower, not red.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

from luftpause.testkit.status import Status, fetch_status

HOST = "127.0.0.1"
# Bounds of a wait for a state (a status, a metric) and for a child to start answering: far
# beyond what either takes on a loaded 2-core machine, short of the suite's per-test timeout.
WAIT_SECONDS = 30.0
READY_SECONDS = 60.0

T = TypeVar("T")


def local_url(port: int, scheme: str = "http") -> str:
    """The base URL of a service on loopback `port`."""
    return f"{scheme}://{HOST}:{port}"


# --- bounded waits ------------------------------------------------------------------------------


async def eventually(
    probe: Callable[[], Awaitable[T]],
    ok: Callable[[T], bool],
    what: str,
    timeout: float = WAIT_SECONDS,
    every: float = 0.05,
) -> T:
    """The first value of `probe()` that passes `ok`, read every `every` seconds.

    After `timeout` seconds it fails with an AssertionError that names `what` and shows the last
    value read, so a test whose only check is a wait still says what did not happen.
    """
    seen: list[T] = []
    window = asyncio.timeout(timeout)
    try:
        async with window:
            while not ok(value := await probe()):
                seen[:] = [value]
                await asyncio.sleep(every)
            return value
    except TimeoutError as exc:
        if not window.expired():
            raise
        last = repr(seen[0])[:2000] if seen else "nothing: the first read never finished"
        raise AssertionError(f"waited {timeout:g} s for {what}; last seen: {last}") from exc


async def until_status(
    url: str,
    check: Callable[[Status], bool],
    what: str,
    timeout: float = WAIT_SECONDS,
    session: aiohttp.ClientSession | None = None,
) -> Status:
    """The first scheduler status read from `url` that passes `check` (see `eventually`)."""
    return await eventually(lambda: fetch_status(url, session), check, what, timeout)


async def read_metrics(url: str, session: aiohttp.ClientSession | None = None) -> dict[str, float]:
    """A Prometheus page: every sample by its name with labels, and every labelled name summed
    over its labels under the bare name."""
    if session is None:
        async with aiohttp.ClientSession() as own:
            return await read_metrics(url, own)
    async with session.get(url) as resp:
        text = await resp.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
            if (name := key.split("{")[0]) != key:
                values[name] = values.get(name, 0.0) + float(value)
    return values
