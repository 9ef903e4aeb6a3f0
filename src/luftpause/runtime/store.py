"""The journal file `runs.jsonl` (and `tasks.jsonl`, same format): read it back on start,
append records durably, and hold on through a full disk or a failing fsync.

Shell module (file I/O); the format, the parser and replay are `journal`'s.

Fsync policy: `append` writes one whole line and returns only after `os.fsync`, and the run
awaits it before its next step. A record is written by one `write` of its encoded line; a crash
inside it leaves a torn line without a newline, which `open` cuts off (with a warning) before
appending again, and the records before it replay.

A write or fsync that fails (ENOSPC, EIO, ...) is undone: the file is cut back to its length
before the write, so no half-written record stays behind (a cut that fails too is done before
the next write, which never starts on a torn line). After a failed fsync the cut also drops the
record's pages whatever the kernel kept of them; the records before it had their own fsync.
Then `append` tries again every `retry_every` seconds, in order and for as long as it takes:
runs go on until their next record and wait there, and no journaled record is lost. While the
journal is failing, `failing` says why. A record that begins runs is written with `retry`
false: it is tried once (at once refused while another record waits to be written), so a spawn
is refused with the reason (`JournalUnwritable`), never held, and the first spawn once the disk
has room again succeeds.
`observe`, when given, gets each append's seconds (lock wait, write and fsync; retries
included); `on_failure` each failed try.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

from luftpause.runtime import journal

JOURNAL_NAME = "runs.jsonl"
RETRY_EVERY = 1.0
_READ_CHUNK = 1 << 16

log = structlog.get_logger(service="runtime")


class Syscalls(Protocol):
    """The calls a journal file makes: `os`'s, or a test's that fail on purpose."""

    def write(self, fd: int, data: memoryview, /) -> int: ...

    def fsync(self, fd: int, /) -> None: ...

    def ftruncate(self, fd: int, length: int, /) -> None: ...

    def fstat(self, fd: int, /) -> os.stat_result: ...


class JournalFile:
    """Append-only, fsync'd journal; one writer per process."""

    def __init__(
        self,
        state_dir: Path,
        name: str = JOURNAL_NAME,
        *,
        observe: Callable[[float], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        retry_every: float = RETRY_EVERY,
        syscalls: Syscalls | None = None,
    ) -> None:
        self.path = state_dir / name
        self._observe = observe
        self._on_failure = on_failure
        self._retry_every = retry_every
        self._os: Syscalls = os if syscalls is None else syscalls
        self._fd: int | None = None
        self._lock = asyncio.Lock()
        self._writing = threading.Lock()  # `close` waits for a write under way in its thread
        self._cut_to: int | None = None  # the file's committed length, when a cut failed
        self._failing: str | None = None

    @property
    def failing(self) -> str | None:
        """Why the last write failed, while no write has succeeded since; None when writable."""
        return self._failing

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
        if decoder.skipped:
            log.warning("journal.damaged_lines", path=str(self.path), skipped=decoder.skipped)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if decoder.torn:
            log.warning(
                "journal.torn_tail",
                path=str(self.path),
                bytes=decoder.torn,
                records=len(records),
                hint="a write cut by a crash; the records before it replay",
            )
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - decoder.torn)
            os.fsync(self._fd)
        return records

    async def append(self, record: dict[str, Any], *, retry: bool = True) -> None:
        """Write one record and return once it is on disk, trying until it is (see above); with
        `retry` false the first failure is raised (`OSError`), the record not written."""
        line = journal.encode(record)
        started = time.perf_counter()
        if not retry and self._failing is not None and self._lock.locked():
            raise OSError(f"{self._failing} (another record is waiting to be written)")
        async with self._lock:
            while True:
                try:
                    await asyncio.to_thread(self._write, line)
                    break
                except OSError as exc:
                    self._failed(exc, record)
                    if not retry:
                        raise
                await asyncio.sleep(self._retry_every)
            if self._failing is not None:
                log.warning("journal.writable_again", path=str(self.path))
                self._failing = None
        if self._observe is not None:
            self._observe(time.perf_counter() - started)

    def _failed(self, exc: OSError, record: dict[str, Any]) -> None:
        why = f"{self.path.name}: {exc.strerror or exc}"
        if self._failing is None:
            log.error(
                "journal.unwritable",
                path=str(self.path),
                error=repr(exc),
                record=record.get("type"),
                hint="runs wait at their next record and new runs are refused until it is "
                f"written; tried again every {self._retry_every:g} s",
            )
        self._failing = why
        if self._on_failure is not None:
            self._on_failure(type(exc).__name__ if exc.errno is None else str(exc.errno))

    def _write(self, line: bytes) -> None:
        with self._writing:
            fd = self._fd
            if fd is None:
                raise RuntimeError("journal not open")
            if self._cut_to is not None:  # a failed write's bytes are still there: cut first
                self._cut(fd, self._cut_to)
            committed = self._os.fstat(fd).st_size
            try:
                view = memoryview(line)
                while view:
                    view = view[self._os.write(fd, view) :]
                self._os.fsync(fd)
            except OSError:
                self._cut_to = committed
                try:
                    self._cut(fd, committed)
                except OSError as cut:
                    log.error("journal.cut_failed", path=str(self.path), error=repr(cut))
                raise

    def _cut(self, fd: int, length: int) -> None:
        self._os.ftruncate(fd, length)
        self._os.fsync(fd)
        self._cut_to = None

    def close(self) -> None:
        with self._writing:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
