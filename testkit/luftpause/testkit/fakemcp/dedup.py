"""The fake MCP server's deduplication by idempotency key, and its ledger file.

Shell module (an append-only file, asyncio futures); the counts and the rule are `core`'s
`KeyLedger`. A tool call whose request carries a key in `_meta` (`KEY`, the runtime's
`resend.META_KEY`) runs at most once per key while its result is known: a repeat is answered
with the stored result, a repeat that arrives while the first is still running waits for it.
Calls without a key run every time.

With a ledger file (`--ledger`), every event is appended to it as one JSON line, written to the
kernel before the tool goes on (no fsync: it survives the server's SIGKILL, not a machine
crash), and read back on start: counts and stored results outlive a restart, and a test reads
the file of a server it killed.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from luftpause.testkit.fakemcp.core import KeyLedger

KEY = "luftpause/idempotencyKey"


def read_ledger(path: Path) -> KeyLedger:
    """A ledger file's counts (a torn last line, from a kill mid-write, is left out)."""
    ledger = KeyLedger()
    if path.exists():
        for line in path.read_bytes().split(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            ledger.feed(record)
    return ledger


class Dedup:
    """Calls by idempotency key, as the module docstring says."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.ledger = read_ledger(path) if path is not None else KeyLedger()
        self._fd: int | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._running: dict[str, asyncio.Future[str]] = {}

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def run(self, key: str | None, tool: str, work: Callable[[int], Awaitable[str]]) -> str:
        """The result for `key`: stored, awaited, or `work(n)` run as the tool's n-th keyed
        execution."""
        if key is None:
            return await work(0)
        self._note("received", key, tool)
        stored = self.ledger.answer(key)
        if stored is not None:
            return stored
        running = self._running.get(key)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            n = self.ledger.executions(tool)
            self._note("started", key, tool)
            result = await work(n)
            self._note("finished", key, tool, result=result)
            future.set_result(result)
            return result
        except BaseException:
            future.cancel()  # a repeat waiting for it fails too; the next one executes again
            raise
        finally:
            self._running.pop(key, None)

    def _note(self, event: str, key: str, tool: str, **extra: Any) -> None:
        record = {"event": event, "key": key, "tool": tool, **extra}
        self.ledger.feed(record)
        if self._fd is not None:
            os.write(self._fd, json.dumps(record).encode() + b"\n")


def key_of(meta: Any) -> str | None:
    """The idempotency key of a request's `_meta`, if it carries one."""
    if not isinstance(meta, dict):
        try:
            meta = dict(meta)
        except (TypeError, ValueError):
            return None
    found = meta.get(KEY)
    return found if isinstance(found, str) and found else None
