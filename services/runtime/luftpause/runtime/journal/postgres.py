"""The run journal (and the task file) in PostgreSQL: the same records as `runs.jsonl`, one row
each, shared by every runtime replica on the database (`--journal postgresql://...`).

Shell module (psycopg 3, asyncio); the format and replay are `journal`'s, the leases
`leases`', the replicas' loops `fleet`'s. Tables (made on first connect, `SCHEMA`):

    luftpause_journal   seq (commit order), stream (runs|tasks), key (the run's handle, or the
                        task's id), rid (the record's id: a retried insert is not a second
                        record), replica (who wrote it), record (the JSON line, as the file has it)
    luftpause_archive   the same columns: finished runs past retention (`retention`)
    luftpause_leases    run, owner, epoch, expires: who drives each unfinished run (`leases`)
    luftpause_commands  cancel/approve for a run, asked on one replica, done by its owner (`fleet`)

Durability: `append` returns once the transaction holding the record has committed, which with
PostgreSQL's default `synchronous_commit = on` is once its WAL is flushed: the record is on
disk before the effect it announces, as with the file's fsync. Records of a `batch` line are
stored one row each, in one transaction: all or none, as the line is. Appends are grouped: one
writer takes every record waiting, and writes them in one transaction (a group commit), in the
order they were appended, so a run's records keep their order.

Names: each process holds a session advisory lock on its replica name (`hold_name`), taken at
start and again after the database restarted; a second process started under a name in use is
refused (`NameTaken`): two processes of one name would both think they hold its leases.

Fencing: a record of a run is inserted only while this replica holds the run's lease (checked
in the insert's transaction, the lease row locked `FOR SHARE`, so a take-over waits for it or
comes first); one that begins runs inserts their leases, and a finished record drops its run's.
An append for a run whose lease another replica took raises `LeaseLost`: the run is no longer
this replica's to drive. Inserts take one transaction-scoped advisory lock, so rows commit in
`seq` order and a replica that follows the table by `seq` (`follow`) never skips one.

While the database cannot be reached, `append` tries again every `retry_every` seconds, for as
long as it takes (runs wait at their next record), and `failing` says why; a record that begins
runs is tried once (`retry` false) and refused with `OSError`, as the file does on a full disk.
A record whose commit was cut off is looked up by its `rid` before it is written again.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from luftpause.common.runner import StartupError
from luftpause.runtime.core import forks, journal

RUNS = "runs"
TASKS = "tasks"
RETRY_EVERY = 1.0
_LOCK_INSERTS = 0x6C756674  # the advisory lock every insert takes: rows commit in seq order
_LOCK_SCHEMA = 0x6C756675
_LOCK_NAMES = 0x6C756676  # with hashtext(replica): held by the process that goes by that name
NOTIFY_JOURNAL = "luftpause_journal"
_CONNECT = 2.0  # seconds the writer waits for a connection before it says the database is away
# The pool gives up a chain of reconnection tries after this many seconds, and the next request
# starts a new one at once. Its own default (5 min, the delay doubling from 1 s) left a
# database back after a minute away unused for up to half a minute more.
_RECONNECT = 2.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS luftpause_journal (
    seq bigserial PRIMARY KEY,
    stream text NOT NULL,
    key text NOT NULL,
    rid uuid NOT NULL UNIQUE,
    replica text NOT NULL,
    record text NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS luftpause_journal_key ON luftpause_journal (stream, key, seq);
CREATE TABLE IF NOT EXISTS luftpause_archive (LIKE luftpause_journal);
CREATE INDEX IF NOT EXISTS luftpause_archive_key ON luftpause_archive (stream, key, seq);
CREATE TABLE IF NOT EXISTS luftpause_leases (
    run text PRIMARY KEY,
    owner text NOT NULL,
    epoch integer NOT NULL DEFAULT 1,
    expires timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS luftpause_leases_owner ON luftpause_leases (owner);
CREATE TABLE IF NOT EXISTS luftpause_commands (
    id bigserial PRIMARY KEY,
    run text NOT NULL,
    kind text NOT NULL,
    args text NOT NULL,
    taken text,
    reply text,
    at timestamptz NOT NULL DEFAULT now()
);
"""

log = structlog.get_logger(service="runtime")


class NameTaken(StartupError):
    """Another live process goes by this replica's name: two would drive the same runs."""


class LeaseLost(RuntimeError):
    """The run's lease is another replica's: this one may not journal (or drive) it any more."""

    def __init__(self, runs: Iterable[str]) -> None:
        self.runs = sorted(set(runs))
        super().__init__(f"lease lost for {', '.join(self.runs)}")


def is_url(value: str) -> bool:
    """`--journal` names a database (else it is the file journal's state dir)."""
    return value.startswith(("postgresql://", "postgres://"))


def redacted(url: str) -> str:
    """The URL without its password, for logs and errors."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    return f"postgresql://{info.get('host', '')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


@dataclass(eq=False)
class _Pending:
    """Rows to write together (one appended line), and who waits for them."""

    stream: str
    rows: list[tuple[str, dict[str, Any]]]  # (key, record)
    rid: uuid.UUID
    retry: bool
    done: asyncio.Future[None]
    tried: bool = False  # a try whose commit's outcome is unknown happened
    rids: list[uuid.UUID] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rids = [uuid.uuid5(self.rid, str(i)) for i in range(len(self.rows))]


def rows_of(stream: str, record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The rows one appended line becomes: a batch's records one each, keyed by run (or task)."""
    if stream == RUNS:
        return [(str(r["run"]), r) for r in forks.expand([record])]
    return [(str(record.get("task") or record.get("run")), record)]


class Database:
    """One replica's connections to the database: a pool, the schema, the group-commit writer.

    `replica` names this process in the rows it writes and the leases it holds."""

    def __init__(
        self,
        url: str,
        replica: str,
        *,
        lease_seconds: float,
        retry_every: float = RETRY_EVERY,
        observe: Callable[[float], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        self.replica = replica
        self.lease_seconds = lease_seconds
        self.retry_every = retry_every
        self._observe = observe
        self._on_failure = on_failure
        self.pool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=6,
            open=False,
            check=AsyncConnectionPool.check_connection,
            reconnect_timeout=_RECONNECT,
            kwargs={"autocommit": True, "connect_timeout": 5},
        )
        self._queue: list[_Pending] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._name: psycopg.AsyncConnection[Any] | None = None  # holds the name's lock
        self.failing: str | None = None

    async def connect(self, wait: float | None = None) -> None:
        """Open the pool and make the schema; wait for the database up to `wait` seconds (None:
        as long as it takes, saying so every few seconds)."""
        await self.pool.open(wait=False)
        started = time.monotonic()
        while True:
            try:
                async with self.pool.connection(timeout=5) as conn:
                    await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_SCHEMA,))
                    try:
                        await conn.execute(SCHEMA)
                    finally:
                        await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_SCHEMA,))
                break
            except (psycopg.OperationalError, PoolTimeout) as exc:
                if wait is not None and time.monotonic() - started > wait:
                    raise
                log.warning("journal.database_unreachable", url=redacted(self.url), error=str(exc))
                await asyncio.sleep(self.retry_every)
        self.failing = None
        self._writer = asyncio.create_task(self._write_loop(), name="journal writer")

    async def hold_name(self, wait: float) -> None:
        """Take this replica's name for as long as the process lives (a session advisory lock
        on a connection of its own), waiting up to `wait` seconds for a process that held it
        to be gone; `NameTaken` if another still holds it."""
        deadline = time.monotonic() + wait
        while not await self.keep_name():
            if time.monotonic() >= deadline:
                raise NameTaken(
                    f"another runtime on the journal database goes by the replica name "
                    f"{self.replica!r} (--replica): every process needs its own"
                )
            await asyncio.sleep(self.retry_every)

    async def keep_name(self) -> bool:
        """Hold the name's lock, taking it again if its connection was lost (the database
        restarted); False if another process holds it."""
        if self._name is not None:
            try:
                await self._name.execute("SELECT 1")
                return True
            except psycopg.Error:
                await self._name.close()  # the lock went with its connection
                self._name = None
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=5)
        cur = await conn.execute(
            "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (_LOCK_NAMES, self.replica)
        )
        row = await cur.fetchone()
        if row is not None and row[0]:
            self._name = conn
            return True
        await conn.close()
        return False

    async def close(self) -> None:
        if self._name is not None:
            await self._name.close()
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        for p in self._queue:
            if not p.done.done():
                p.done.set_exception(OSError("the journal is closed"))
        await self.pool.close()

    async def ping(self) -> str | None:
        """None while the database answers, else why not."""
        try:
            async with self.pool.connection(timeout=2) as conn:
                await conn.execute("SELECT 1")
            return None
        except (psycopg.Error, PoolTimeout, OSError) as exc:
            return f"the journal database {redacted(self.url)} is unreachable: {exc}"

    async def read(
        self, stream: str, keys: Iterable[str] | None = None, *, archive: bool = False
    ) -> tuple[list[dict[str, Any]], int]:
        """The stream's committed records (of `keys` only, if given) in commit order, and the
        highest `seq` of the table when they were read."""
        table = "luftpause_archive" if archive else "luftpause_journal"
        where = "stream = %s" + ("" if keys is None else " AND key = ANY(%s)")
        params: list[Any] = [stream] if keys is None else [stream, list(keys)]
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(f"SELECT record FROM {table} WHERE {where} ORDER BY seq", params)
            records = [json.loads(text) for (text,) in await cur.fetchall()]
            await cur.execute("SELECT coalesce(max(seq), 0) FROM luftpause_journal")
            top = await cur.fetchone()
        return records, int(top[0]) if top else 0

    async def archive(self, stream: str, keys: Iterable[str]) -> int:
        """Move the keys' rows to the archive table in one transaction; the rows moved (none
        when another replica moved them first)."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "WITH moved AS (DELETE FROM luftpause_journal WHERE stream = %s AND key = ANY(%s) "
                "RETURNING *) INSERT INTO luftpause_archive SELECT * FROM moved",
                (stream, sorted(keys)),
            )
            return cur.rowcount

    # --- the writer ---

    async def append(self, stream: str, record: dict[str, Any], *, retry: bool) -> None:
        """Queue one line's rows for the writer and return once they are committed."""
        if not retry and self.failing is not None:
            raise OSError(self.failing)
        started = time.perf_counter()
        pending = _Pending(
            stream=stream,
            rows=rows_of(stream, record),
            rid=uuid.uuid4(),
            retry=retry,
            done=asyncio.get_running_loop().create_future(),
        )
        self._queue.append(pending)
        self._wake.set()
        await pending.done
        if self._observe is not None:
            self._observe(time.perf_counter() - started)

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    refused = await self._write(batch)
                except (psycopg.OperationalError, PoolTimeout, OSError) as exc:
                    self._failed(exc)
                    for p in batch:
                        p.tried = True
                    again = [p for p in batch if p.retry]
                    for p in batch:
                        if not p.retry and not p.done.done():
                            p.done.set_exception(OSError(self.failing))
                    self._queue = again + self._queue
                    await asyncio.sleep(self.retry_every)
                    continue
                if self.failing is not None:
                    log.warning("journal.writable_again", url=redacted(self.url))
                    self.failing = None
                for p in batch:
                    if p.done.done():
                        continue
                    lost = refused.get(id(p))
                    if lost is None:
                        p.done.set_result(None)
                    else:
                        p.done.set_exception(lost)

    def _failed(self, exc: BaseException) -> None:
        why = f"journal database {redacted(self.url)}: {exc}"
        if self.failing is None:
            log.error(
                "journal.unwritable",
                error=str(exc),
                hint=f"runs wait at their next record; tried again every {self.retry_every:g} s",
            )
        self.failing = why
        if self._on_failure is not None:
            self._on_failure(type(exc).__name__)

    async def _write(self, batch: list[_Pending]) -> dict[int, Exception]:
        """One transaction for every waiting line; the lines refused (`LeaseLost`, or a run
        that exists already) by id."""
        refused: dict[int, Exception] = {}
        async with self.pool.connection(timeout=_CONNECT) as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_INSERTS,))
            batch = await self._not_yet_written(conn, batch)
            runs = [k for p in batch if p.stream == RUNS for k, r in p.rows]
            starts = {k for p in batch if p.stream == RUNS for k, r in p.rows if _starts(r)}
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(
                "SELECT run FROM luftpause_leases WHERE run = ANY(%s) AND owner = %s FOR SHARE",
                (sorted(set(runs) - starts), self.replica),
            )
            held = {row[0] for row in await cur.fetchall()}
            if starts:
                await cur.execute(
                    "INSERT INTO luftpause_leases (run, owner, expires) "
                    "SELECT r, %s, now() + make_interval(secs => %s) FROM unnest(%s::text[]) r "
                    "ON CONFLICT (run) DO NOTHING RETURNING run",
                    (self.replica, self.lease_seconds, sorted(starts)),
                )
                held |= {row[0] for row in await cur.fetchall()}
            rows: list[tuple[str, str, uuid.UUID, str, str]] = []
            ended: list[str] = []
            for p in batch:
                keys = {k for k, _ in p.rows} if p.stream == RUNS else set()
                if keys - held:
                    refused[id(p)] = (
                        _Exists(keys & starts) if keys & starts - held else LeaseLost(keys - held)
                    )
                    continue
                for rid, (key, record) in zip(p.rids, p.rows, strict=True):
                    text = journal.encode(record).decode().rstrip("\n")
                    rows.append((p.stream, key, rid, self.replica, text))
                    if p.stream == RUNS and record.get("type") == "finished":
                        ended.append(key)
            if rows:
                await cur.executemany(
                    "INSERT INTO luftpause_journal (stream, key, rid, replica, record) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    rows,
                )
                await cur.execute("SELECT pg_notify(%s, '')", (NOTIFY_JOURNAL,))
            if ended:
                await cur.execute(
                    "DELETE FROM luftpause_leases WHERE run = ANY(%s) AND owner = %s",
                    (ended, self.replica),
                )
        return refused

    async def _not_yet_written(
        self, conn: psycopg.AsyncConnection[Any], batch: list[_Pending]
    ) -> list[_Pending]:
        """A line tried before whose commit was cut off may be in: resolve those, keep the rest."""
        tried = [rid for p in batch if p.tried for rid in p.rids[:1]]
        if not tried:
            return batch
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute("SELECT rid FROM luftpause_journal WHERE rid = ANY(%s)", (tried,))
        found = {row[0] for row in await cur.fetchall()}
        for p in batch:
            if p.rids[0] in found and not p.done.done():
                p.done.set_result(None)
        return [p for p in batch if p.rids[0] not in found]


def _starts(record: dict[str, Any]) -> bool:
    return record.get("type") in forks.STARTS


class _Exists(RuntimeError):
    """A record that begins runs whose handle the database has already."""

    def __init__(self, runs: Iterable[str]) -> None:
        super().__init__(f"runs exist already: {', '.join(sorted(runs))}")


class PgJournal:
    """One stream of the database as a journal store (`file.Store`): what `JournalFile` is for
    a file. `load` reads it before `open` hands the records over."""

    def __init__(self, db: Database, stream: str = RUNS) -> None:
        self.db = db
        self.stream = stream
        self.name = f"{redacted(db.url)}#{stream}"
        self._loaded: list[dict[str, Any]] | None = None
        self.top = 0  # the table's highest seq when loaded: `follow` goes on from there

    async def load(self) -> None:
        self._loaded, self.top = await self.db.read(self.stream)

    def open(self) -> list[dict[str, Any]]:
        if self._loaded is None:
            raise RuntimeError("PgJournal.open before load")
        records, self._loaded = self._loaded, []
        return records

    async def append(self, record: dict[str, Any], *, retry: bool = True) -> None:
        try:
            await self.db.append(self.stream, record, retry=retry)
        except _Exists as exc:
            raise OSError(str(exc)) from exc

    @property
    def failing(self) -> str | None:
        return self.db.failing

    async def committed(self, handles: Iterable[str] | None = None) -> list[dict[str, Any]]:
        records, _ = await self.db.read(self.stream, handles)
        return records

    async def archive(self, handles: set[str]) -> int:
        return await self.db.archive(self.stream, handles)

    def close(self) -> None:
        """The database's connections close with `Database.close`."""
