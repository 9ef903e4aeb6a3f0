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

Retention (`archive`): the records of runs that `retention` let go are written to a file of
their own under `archive/` (fsync'd), then the live records to a new file; both from the journal
as it was read, while appends go on. Then appends wait while the lines they added meanwhile are
copied to the new file, which is fsync'd and renamed over the journal (and the directory
fsync'd): a crash leaves the old journal or the new one, never half of one, and a start reads
only what is live. A crash before the rename leaves the let-go runs in the old journal too; the
next `archive` writes them out again.
`Store` is what the runtime needs of a journal, this file or a database's (`postgres`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from luftpause.runtime.core import journal, retention

JOURNAL_NAME = "runs.jsonl"
ARCHIVE_DIR = "archive"
RETRY_EVERY = 1.0
_READ_CHUNK = 1 << 16

log = structlog.get_logger(service="runtime")


class Syscalls(Protocol):
    """The calls a journal file makes: `os`'s, or a test's that fail on purpose."""

    def write(self, fd: int, data: memoryview, /) -> int: ...

    def fsync(self, fd: int, /) -> None: ...

    def ftruncate(self, fd: int, length: int, /) -> None: ...

    def fstat(self, fd: int, /) -> os.stat_result: ...


class Store(Protocol):
    """A journal: read back on start, appended durably, read again for exports, and let go of
    the runs retention no longer keeps."""

    def open(self) -> list[dict[str, Any]]: ...

    async def append(self, record: dict[str, Any], *, retry: bool = True) -> None: ...

    @property
    def failing(self) -> str | None: ...

    async def committed(self, handles: Iterable[str] | None = None) -> list[dict[str, Any]]: ...

    async def archive(self, handles: set[str]) -> int: ...

    def close(self) -> None: ...


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
        key: Callable[[Mapping[str, Any]], str] = retention.run_of,
    ) -> None:
        self.path = state_dir / name
        self._key = key  # what `archive` lets go by: a record's run, or its task
        self._observe = observe
        self._on_failure = on_failure
        self._retry_every = retry_every
        self._os: Syscalls = os if syscalls is None else syscalls
        self._fd: int | None = None
        self._lock = asyncio.Lock()
        self._writing = threading.Lock()  # `close` waits for a write under way in its thread
        self._cut_to: int | None = None  # the file's committed length, when a cut failed
        self._failing: str | None = None
        self._archiving = asyncio.Lock()  # one retention pass at a time

    @property
    def failing(self) -> str | None:
        """Why the last write failed, while no write has succeeded since; None when writable."""
        return self._failing

    def open(self) -> list[dict[str, Any]]:
        """Read every committed record, cut off a torn tail, and open for appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        records, decoder = read_records(self.path)
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

    async def committed(self, handles: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Every committed record (a line being written is not yet one), batches taken apart,
        of `handles` only if given."""
        records, _ = await asyncio.to_thread(read_records, self.path)
        expanded = retention.expand(records)
        if handles is None:
            return expanded
        wanted = set(handles)
        return [r for r in expanded if r.get("run") in wanted]

    async def archive(self, handles: set[str]) -> int:
        """Move the runs' records to an archive file and rewrite the journal without them (the
        module docstring); the records moved. Appends go on while the journal read so far is
        rewritten, and wait only while what they added meanwhile is copied over."""
        if not handles:
            return 0
        async with self._archiving:
            pass_ = await asyncio.to_thread(self._rewrite, handles)
            if pass_ is None:
                return 0
            async with self._lock:
                moved = await asyncio.to_thread(self._swap, pass_, handles)
        log.info("journal.archived", path=str(pass_.archive), runs=len(handles), records=moved,
                 live=pass_.live)  # fmt: skip
        return moved

    def _rewrite(self, handles: set[str]) -> _Rewrite | None:
        """The archive file and the new journal for what the journal holds now, both synced;
        a line at a time, so a long history is never in memory at once."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        archive = self.path.parent / ARCHIVE_DIR / f"{self.path.stem}-{stamp}.jsonl"
        archive.parent.mkdir(parents=True, exist_ok=True)
        fresh = self.path.with_name(self.path.name + ".new")
        decoder = journal.JournalDecoder()
        read = moved = kept = 0
        with self.path.open("rb") as src, archive.open("wb") as gone_to, fresh.open("wb") as to:
            while chunk := src.read(_READ_CHUNK):
                read += len(chunk)
                live, gone = retention.split(decoder.feed(chunk), handles, self._key)
                to.writelines(map(journal.encode, live))
                gone_to.writelines(map(journal.encode, gone))
                moved, kept = moved + len(gone), kept + len(live)
            for f in (gone_to, to):
                f.flush()
                os.fsync(f.fileno())
        if not moved:
            archive.unlink()
            fresh.unlink()
            return None
        _fsync_dir(archive.parent)
        decoder.flush()  # a line still being written is not read: `_swap` copies it
        return _Rewrite(
            archive=archive, fresh=fresh, read_to=read - decoder.torn, moved=moved, live=kept
        )

    def _swap(self, pass_: _Rewrite, handles: set[str]) -> int:
        """Copy the records appended since `_rewrite` read the journal (no append is under way:
        the caller holds the lock), then rename the new journal over it."""
        with self._writing:
            end = self._cut_to if self._cut_to is not None else os.stat(self.path).st_size
            with self.path.open("rb") as f:
                f.seek(pass_.read_to)
                tail = f.read(end - pass_.read_to)
            decoder = journal.JournalDecoder()
            tail_records = decoder.feed(tail) + decoder.flush()
            live, gone = retention.split(tail_records, handles, self._key)
            _append_synced(pass_.archive, gone)
            _append_synced(pass_.fresh, live)
            os.replace(pass_.fresh, self.path)
            _fsync_dir(self.path.parent)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND, 0o644)
            self._cut_to = None
        return pass_.moved + len(gone)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rewrite:
    """A retention pass between its two steps: files written, not yet renamed."""

    archive: Path
    fresh: Path
    read_to: int  # the journal's bytes read (whole lines); appends since then follow
    moved: int
    live: int


def read_records(path: Path) -> tuple[list[dict[str, Any]], journal.JournalDecoder]:
    """A journal file's committed records and the decoder that read them (torn, skipped)."""
    decoder = journal.JournalDecoder()
    records: list[dict[str, Any]] = []
    if path.exists():
        with path.open("rb") as f:
            while chunk := f.read(_READ_CHUNK):
                records += decoder.feed(chunk)
        records += decoder.flush()
    return records, decoder


def _append_synced(path: Path, records: list[dict[str, Any]]) -> None:
    if records:
        _write_synced(path, records, mode="ab")


def _write_synced(path: Path, records: list[dict[str, Any]], mode: str = "wb") -> None:
    with path.open(mode) as f:
        f.writelines(journal.encode(r) for r in records)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
