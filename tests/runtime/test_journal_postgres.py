"""The PostgreSQL journal on a real server: the golden journals replay from it as from the file,
appends are committed in order and only under the run's lease, leases are taken over and
shared, a restart of the server loses nothing, retention moves rows to the archive."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg
import pytest

from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.leases import Leases, share
from luftpause.runtime.journal.postgres import (
    RUNS,
    Database,
    LeaseLost,
    NameTaken,
    PgJournal,
    rows_of,
)
from luftpause.testkit.postgres import Postgres
from tests import pg
from tests.runtime.make_golden import GOLDEN, canonical_state

LEASE = 0.6


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    with pg.server() as running:
        yield running


@pytest.fixture
def url(server: Postgres) -> str:
    return pg.empty(server)


@asynccontextmanager
async def database(url: str, replica: str, lease: float = 30.0) -> AsyncIterator[Database]:
    db = Database(url, replica, lease_seconds=lease, retry_every=0.1)
    await db.connect(wait=30)
    try:
        yield db
    finally:
        await db.close()


def spawned(handle: str) -> dict[str, object]:
    return j.spawned_record(m.RunSpec(handle=handle, task="rivers", model="sim"))


def turn(handle: str, n: int) -> dict[str, object]:
    d = m.RecordTurn(round=n, assistant=m.assistant_message(None, ()), usage=m.Usage(turns=1))
    return j.turn_record(handle, d)


def insert_rows(url: str, records: list[dict[str, object]]) -> None:
    """The rows the writer would insert for these lines (no lease checks: replay's input)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for record in records:
            for key, r in rows_of(RUNS, record):
                conn.execute(
                    "INSERT INTO luftpause_journal (stream, key, rid, replica, record) "
                    "VALUES (%s, %s, gen_random_uuid(), 'golden', %s)",
                    (RUNS, key, j.encode(r).decode().rstrip("\n")),
                )


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.jsonl")), ids=lambda p: p.stem)
async def test_golden_journals_replay_from_the_database_as_from_the_file(
    url: str, path: Path
) -> None:
    decoder = j.JournalDecoder()
    records = decoder.feed(path.read_bytes()) + decoder.flush()
    async with database(url, "a") as db:
        insert_rows(url, records)
        store = PgJournal(db)
        await store.load()
        replayed = j.replay(store.open())
    recorded = json.loads(path.with_suffix(".state.json").read_text())
    assert canonical_state(replayed) == recorded


async def test_appends_are_committed_in_the_order_they_were_made(url: str) -> None:
    async with database(url, "a") as db:
        store = PgJournal(db)
        await store.append(spawned("run-a"), retry=False)
        await store.append(spawned("run-b"), retry=False)
        await asyncio.gather(
            *(store.append(turn(h, n)) for n in range(1, 21) for h in ("run-a", "run-b"))
        )
        records = await store.committed(["run-a"])
    assert [r.get("round") for r in records] == [None, *range(1, 21)]


async def test_a_batch_line_is_stored_one_row_per_record_and_reads_back_the_same(url: str) -> None:
    from luftpause.runtime.core import forks

    batch = forks.batch_record([spawned("run-x"), spawned("run-y")])
    async with database(url, "a") as db:
        store = PgJournal(db)
        await store.append(batch, retry=False)
        assert await store.committed() == [spawned("run-x"), spawned("run-y")]


async def test_a_run_that_exists_already_is_refused(url: str) -> None:
    async with database(url, "a") as a, database(url, "b") as b:
        await PgJournal(a).append(spawned("run-1"), retry=False)
        with pytest.raises(OSError, match="exist already"):
            await PgJournal(b).append(spawned("run-1"), retry=False)


async def test_a_replica_whose_lease_was_taken_over_cannot_journal_the_run(url: str) -> None:
    async with database(url, "a", LEASE) as a, database(url, "b", LEASE) as b:
        await PgJournal(a).append(spawned("run-1"), retry=False)
        taken: list[str] = []
        async with asyncio.timeout(10):
            while not taken:
                await asyncio.sleep(LEASE / 3)
                taken = await Leases(b).claim()
        assert taken == ["run-1"]
        with pytest.raises(LeaseLost):
            await PgJournal(a).append(turn("run-1", 1))
        await PgJournal(b).append(turn("run-1", 1))
        assert await Leases(a).renew() == set()
        assert await Leases(b).renew() == {"run-1"}
        assert [r["type"] for r in await PgJournal(b).committed()] == ["spawned", "turn"]


async def test_a_finished_run_lets_go_of_its_lease(url: str) -> None:
    async with database(url, "a") as db:
        store = PgJournal(db)
        await store.append(spawned("run-1"), retry=False)
        done = m.RecordFinished(
            phase=m.Phase.FINISHED, result="ok", error=None, usage=m.Usage(), at=1.0
        )
        await store.append(j.finished_record("run-1", done))
        assert await Leases(db).renew() == set()


async def test_the_leases_of_a_dead_replica_are_shared_among_the_living(url: str) -> None:
    async with (
        database(url, "dead", LEASE) as dead,
        database(url, "b", 30) as b,
        database(url, "c", 30) as c,
    ):
        await PgJournal(b).append(spawned("run-b"), retry=False)
        await PgJournal(c).append(spawned("run-c"), retry=False)
        for i in range(6):
            await PgJournal(dead).append(spawned(f"run-{i}"), retry=False)
        await asyncio.sleep(LEASE * 1.5)  # the dead replica renews nothing: its leases expire
        first = await Leases(b).claim()  # 6 free, 2 living: half
        second = await Leases(c).claim()  # 3 free: half, rounded up
        third = await Leases(b).claim()
        assert (len(first), len(second), len(third)) == (3, 2, 1)
        assert sorted(first + second + third) == [f"run-{i}" for i in range(6)]


def test_a_share_is_even_and_never_zero_while_leases_are_free() -> None:
    assert [share(n, 3) for n in (0, 1, 3, 7)] == [0, 1, 1, 3]
    assert share(5, 0) == 5


async def test_appends_wait_while_the_server_restarts_and_each_is_written_once(
    server: Postgres, url: str
) -> None:
    async with database(url, "a") as db:
        store = PgJournal(db)
        await store.append(spawned("run-1"), retry=False)
        assert await db.ping() is None
        await asyncio.to_thread(server.stop)
        try:
            pinging = asyncio.create_task(db.ping())  # what readiness says meanwhile
            writes = asyncio.gather(*(store.append(turn("run-1", n)) for n in range(1, 6)))
            async with asyncio.timeout(10):
                while db.failing is None:
                    await asyncio.sleep(0.05)
            with pytest.raises(OSError):  # a run is refused, not held, while it is down
                await store.append(spawned("run-2"), retry=False)
            down = await pinging
        finally:
            await asyncio.to_thread(server.start)
        async with asyncio.timeout(30):
            await writes
        assert db.failing is None
        records = await store.committed()
    assert [r.get("round") for r in records] == [None, 1, 2, 3, 4, 5]
    assert down is not None and "unreachable" in down and "password" not in down


async def test_archived_runs_leave_the_live_rows_for_the_archive_table(url: str) -> None:
    async with database(url, "a") as db:
        store = PgJournal(db)
        for h in ("run-old", "run-live"):
            await store.append(spawned(h), retry=False)
        assert await store.archive({"run-old"}) == 1
        assert await store.archive({"run-old"}) == 0  # another replica got there first
        assert [r["run"] for r in await store.committed()] == ["run-live"]
        archived, _ = await db.read(RUNS, archive=True)
    assert [r["run"] for r in archived] == ["run-old"]


async def test_a_second_process_under_a_name_in_use_is_refused_until_the_first_is_gone(
    url: str,
) -> None:
    async with database(url, "r1") as first:
        await first.hold_name(wait=0)
        second = Database(url, "r1", lease_seconds=30, retry_every=0.05)
        try:
            with pytest.raises(NameTaken, match="'r1'"):
                await second.hold_name(wait=0.2)
            assert await first.keep_name()
        finally:
            await second.close()
    async with database(url, "r1") as again:
        await again.hold_name(wait=5)  # the first's lock went with its connection
