"""Reading the scheduler's `GET /status` from tests and benchmarks, with bounded waits.

Shell module (HTTP through aiohttp).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp

Status = dict[str, Any]


async def fetch_status(url: str, session: aiohttp.ClientSession | None = None) -> Status:
    """One read of the scheduler's status JSON."""
    if session is None:
        async with aiohttp.ClientSession() as own:
            return await fetch_status(url, own)
    async with session.get(url) as resp:
        result: Status = await resp.json()
        return result


async def wait_for_status(
    url: str,
    check: Callable[[Status], bool],
    timeout: float = 20.0,
    session: aiohttp.ClientSession | None = None,
) -> Status:
    """The first status that passes `check`, polled every 50 ms within `timeout`."""
    async with asyncio.timeout(timeout):
        while not check(status := await fetch_status(url, session)):  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.05)
        return status
