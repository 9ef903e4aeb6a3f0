"""The journal file `runs.jsonl` (and `tasks.jsonl`, same format): read it back on start,
append records durably.

Shell module (file I/O); the format, the parser and replay are `journal`'s.

Fsync policy: `append` writes one whole line and returns only after `os.fsync`, and the run
awaits it before its next turn starts. So a crash loses at most the round in progress: the turn
and the tool calls made since the run's last journaled round, which run again on resume. A
record is written by one `write` of its encoded line; a crash inside it leaves a torn line
without a newline, which `open` cuts off before appending again. `observe`, when given, gets
each append's seconds (lock wait, write and fsync), for the runtime's metrics.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from luftpause.runtime import journal

JOURNAL_NAME = "runs.jsonl"
_READ_CHUNK = 1 << 16


class JournalFile:
    """Append-only, fsync'd journal; one writer per process."""

    def __init__(
        self,
        state_dir: Path,
        name: str = JOURNAL_NAME,
        *,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.path = state_dir / name
        self._observe = observe
        self._fd: int | None = None
        self._lock = asyncio.Lock()

    def open(self) -> list[dict[str, Any]]:
        """Read every committed record, cut off a torn tail, and open for appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        decoder = journal.JournalDecoder()
        records: list[dict[str, Any]] = []
        if self.path.exists():
            with self.path.open("rb") as f:
                while chunk := f.read(_READ_CHUNK):
                    records += decoder.feed(chunk)
            records += decoder.flush()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if decoder.torn:
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - decoder.torn)
            os.fsync(self._fd)
        return records

    async def append(self, record: dict[str, Any]) -> None:
        """Write one record and return once it is on disk."""
        line = journal.encode(record)
        started = time.perf_counter()
        async with self._lock:
            await asyncio.to_thread(self._write, line)
        if self._observe is not None:
            self._observe(time.perf_counter() - started)

    def _write(self, line: bytes) -> None:
        assert self._fd is not None, "journal not open"
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
