"""`journal.file`: the journal file through a full disk and a failing fsync (the system calls
fail on purpose, on a real file), and what it says about a torn tail."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.file import JournalFile

SPEC = m.RunSpec(handle="run-1", task="rivers", model="sim")
WAIT = 10.0


def record(n: int) -> dict[str, object]:
    d = m.RecordFinished(phase=m.Phase.FINISHED, result="x" * n, error=None)
    return j.finished_record(f"run-{n}", d)


class Disk:
    """`os`, but writes fail once `full` (after writing `partial` bytes of the call) and fsync
    fails while `broken`."""

    def __init__(self) -> None:
        self.full = False
        self.partial = 0
        self.broken = False
        self.cut_fails = False
        self.writes = 0

    def write(self, fd: int, data: memoryview, /) -> int:
        self.writes += 1
        if self.full:
            if self.partial:
                done, self.partial = os.write(fd, data[: self.partial]), 0
                return done
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    def fsync(self, fd: int, /) -> None:
        if self.broken:
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    def ftruncate(self, fd: int, length: int, /) -> None:
        if self.cut_fails:
            raise OSError(errno.EIO, "Input/output error")
        os.ftruncate(fd, length)

    def fstat(self, fd: int, /) -> os.stat_result:
        return os.fstat(fd)


def on_disk(path: Path) -> tuple[list[dict[str, object]], j.JournalDecoder]:
    decoder = j.JournalDecoder()
    records = decoder.feed(path.read_bytes()) + decoder.flush()
    return records, decoder


async def until(check: object) -> None:
    async with asyncio.timeout(WAIT):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.01)


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def store(tmp_path: Path, disk: Disk) -> JournalFile:
    journal_file = JournalFile(tmp_path, retry_every=0.02, syscalls=disk)
    journal_file.open()
    return journal_file


async def test_a_full_disk_leaves_no_half_record_and_the_record_goes_in_once_there_is_room(
    tmp_path: Path, disk: Disk
) -> None:
    failures: list[str] = []
    store = JournalFile(tmp_path, retry_every=0.02, syscalls=disk, on_failure=failures.append)
    store.open()
    await store.append(record(1))
    disk.full, disk.partial = True, 7  # the write gets 7 bytes in, then the disk is full
    waiting = asyncio.create_task(store.append(record(2)))
    await until(lambda: store.failing is not None and disk.writes >= 4)
    records, decoder = on_disk(store.path)
    assert records == [record(1)] and decoder.torn == 0  # the 7 bytes were cut again
    assert store.failing == "runs.jsonl: No space left on device"
    assert not waiting.done() and failures[0] == str(errno.ENOSPC)
    disk.full = False
    async with asyncio.timeout(WAIT):
        await waiting
    assert on_disk(store.path)[0] == [record(1), record(2)] and store.failing is None


async def test_a_failed_fsync_cuts_the_record_and_writes_it_again_once(
    store: JournalFile, disk: Disk
) -> None:
    await store.append(record(1))
    disk.broken = True
    waiting = asyncio.create_task(store.append(record(2)))
    await until(lambda: store.failing is not None)
    assert on_disk(store.path)[0] == [record(1)]
    assert store.failing == "runs.jsonl: Input/output error"
    disk.broken = False
    async with asyncio.timeout(WAIT):
        await waiting
    assert on_disk(store.path)[0] == [record(1), record(2)]


async def test_a_cut_that_fails_is_made_before_the_next_write_so_no_line_is_joined(
    store: JournalFile, disk: Disk
) -> None:
    await store.append(record(1))
    disk.full, disk.partial, disk.cut_fails = True, 9, True
    waiting = asyncio.create_task(store.append(record(2)))
    await until(lambda: disk.writes >= 3)
    disk.full, disk.cut_fails = False, False
    async with asyncio.timeout(WAIT):
        await waiting
    records, decoder = on_disk(store.path)
    assert records == [record(1), record(2)] and decoder.skipped == 0 and decoder.torn == 0


async def test_a_record_that_begins_runs_is_refused_at_once_while_another_waits(
    store: JournalFile, disk: Disk
) -> None:
    disk.full = True
    with pytest.raises(OSError, match="No space left on device"):
        await store.append(record(1), retry=False)  # tried once, not held
    waiting = asyncio.create_task(store.append(record(2)))
    await until(lambda: disk.writes >= 2)
    with pytest.raises(OSError, match="another record is waiting to be written"):
        await store.append(record(3), retry=False)
    disk.full = False
    async with asyncio.timeout(WAIT):
        await waiting
    await store.append(record(4), retry=False)
    assert on_disk(store.path)[0] == [record(2), record(4)]


async def test_appends_keep_their_order_through_a_full_disk(store: JournalFile, disk: Disk) -> None:
    disk.full = True
    waiting = [asyncio.create_task(store.append(record(n))) for n in range(1, 6)]
    await until(lambda: disk.writes >= 3)
    disk.full = False
    async with asyncio.timeout(WAIT):
        await asyncio.gather(*waiting)
    assert on_disk(store.path)[0] == [record(n) for n in range(1, 6)]


def test_a_torn_last_line_is_cut_with_a_warning_and_the_records_before_it_are_kept(
    tmp_path: Path,
) -> None:
    whole = j.encode(j.spawned_record(SPEC))
    (tmp_path / "runs.jsonl").write_bytes(whole + j.encode(record(1))[:25])
    with capture_logs() as logs:
        records = JournalFile(tmp_path).open()
    assert records == [j.spawned_record(SPEC)]
    [warning] = [e for e in logs if e["event"] == "journal.torn_tail"]
    assert warning["log_level"] == "warning" and warning["bytes"] == 25
    assert warning["records"] == 1
    assert (tmp_path / "runs.jsonl").read_bytes() == whole
