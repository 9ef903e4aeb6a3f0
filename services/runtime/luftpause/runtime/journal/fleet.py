"""One replica among several on a shared journal database: its leases, what the others write,
and the cancels and approvals they ask of it.

Shell module: three loops over `postgres`' database, between it and `loop.runtime.Runtime`.

    leases   every third of a lease time: renew this replica's leases (`leases`), and drive
             the runs among them not driven yet (this replica's name started again, as a
             container restarted in its pod is); a run it drives whose lease is gone
             (another replica took it while this one could not renew) stops here and
             becomes a view (`Runtime.lost`); then claim this replica's
             share of the expired leases, read those runs' records and drive them
             (`Runtime.take`): a dead replica's runs resume on the survivors, from their last
             journaled point, under `resend`'s rules for the calls they had sent.
    follow   LISTEN for new rows (NOTIFY in each writer's transaction), and read them in `seq`
             order: the views of runs driven elsewhere step (`Runtime.observe`), tasks too
             (`observe` of the tasks extension); and the commands asked of runs driven here
             are carried out. Also every `poll` seconds without a notification, and after a
             reconnect: nothing is missed, at worst seen a poll later.
    commands `ask` writes a command (cancel, approve) for a run driven elsewhere; its owner's
             follow loop carries it out (`Runtime.command`) and writes the reply; `ask` returns
             it, or an error once `lease_seconds` twice over (and a margin) have passed.

Each tick first makes sure this process still holds its replica name (`Database.keep_name`);
if another process took it while the database was away from this one, this one stops driving
its runs (they are the other's now) and says so.

On stop, `close` lets go of this replica's leases (their expiry set to now), so a rolling
restart hands the runs over at the survivors' next look instead of a lease time later.
While the database is away every loop says so once, waits and goes on: runs wait at their next
record (`postgres`), views and commands catch up when it is back. Leases expire meanwhile,
everyone's alike; so a replica that could not reach the database claims nothing for a lease
time after it can again, long enough for the others to renew theirs: a database restart
hands no run over (which would turn the calls it had out into calls of unknown outcome).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
import structlog
from psycopg.rows import tuple_row

from luftpause.runtime.core import journal
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.leases import UNREACHABLE, Leases, renew_every
from luftpause.runtime.journal.postgres import NOTIFY_JOURNAL, RUNS, TASKS, Database, PgJournal
from luftpause.runtime.loop.runtime import Runtime

NOTIFY_COMMANDS = "luftpause_commands"
POLL = 1.0
_PAGE = 5000
_ASK_POLL = 0.05
_ASK_MARGIN = 10.0

log = structlog.get_logger(service="runtime")

Observe = Callable[[dict[str, Any]], None]


class Fleet:
    """This replica's loops (the module docstring)."""

    def __init__(
        self,
        db: Database,
        runtime: Runtime,
        runs: PgJournal,
        *,
        tasks: PgJournal | None = None,
        observe_task: Observe | None = None,
        poll: float = POLL,
    ) -> None:
        self.db = db
        self.runtime = runtime
        self.journal = runs
        self.leases = Leases(db)
        self.poll = poll
        self._observers: dict[str, Observe] = {RUNS: runtime.observe}
        self._last: dict[str, int] = {RUNS: runs.top}
        if tasks is not None and observe_task is not None:
            self._observers[TASKS] = observe_task
            self._last[TASKS] = tasks.top
        self._loops: list[asyncio.Task[None]] = []
        self._handling: set[asyncio.Task[None]] = set()
        self._down: dict[str, str] = {}  # loop -> why it cannot reach the database
        # After the database was away, no claims for a lease time: the other replicas were
        # cut off too, and renew their leases once they reach it again.
        self._claims_held = False
        self._claims_from = 0.0
        self._pulling = asyncio.Lock()

    def start(self) -> None:
        self.runtime.remote = self.ask
        self.runtime.sync = self.sync
        self._loops = [
            asyncio.create_task(self._lease_loop(), name="fleet leases"),
            asyncio.create_task(self._follow_loop(), name="fleet follow"),
        ]

    async def close(self) -> None:
        """Stop the loops and hand this replica's leases over (call after the runs stopped)."""
        for task in [*self._loops, *self._handling]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._handling, return_exceptions=True)
        with contextlib.suppress(*UNREACHABLE):
            async with asyncio.timeout(2), self.db.pool.connection(timeout=2) as conn:
                await conn.execute(
                    "UPDATE luftpause_leases SET expires = now() WHERE owner = %s",
                    (self.db.replica,),
                )

    # --- leases ---

    async def _lease_loop(self) -> None:
        every = renew_every(self.db.lease_seconds)
        while True:
            try:
                await self._lease_tick()
                self._up("leases")
            except UNREACHABLE as exc:
                self._unreachable("leases", exc)
            except Exception:  # a bug must not stop the renewals: the runs would move
                log.exception("fleet.lease_tick_failed")
            await asyncio.sleep(every)

    async def _lease_tick(self) -> None:
        if not await self.db.keep_name():
            await self._name_taken()
            return
        runs = self.runtime.runs
        # Before the renewal: a run begun during it may have its lease renewed or not yet.
        driving = {h for h, r in runs.items() if r.here and not r.state.phase.over}
        held = await self.leases.renew()
        # Still driven here and not held: another replica took it. A run that ended meanwhile
        # dropped its lease with its finished record.
        lost = {h for h in driving - held if runs[h].here and not runs[h].state.phase.over}
        lost |= self.runtime.stale
        if lost:
            await self.runtime.lost(await self._states(lost))
            self.runtime.stale -= lost
        # Held and not known here as driven: this replica's name started again (a container
        # restarted in its pod). A run driven here whose state is over is not one: its
        # finished record is on its way (`Runtime.take` refuses those, and runs being begun).
        mine = {h for h, r in runs.items() if r.here}
        claimed = sorted(held - mine) + await self._claim()
        if claimed:
            states = await self._states(set(claimed))
            self.runtime.take(states)
            async with self.db.pool.connection() as conn:  # commands that waited for them
                await self._take_commands(conn)

    async def _claim(self) -> list[str]:
        """This replica's share of the expired leases, unless the database was away from it
        less than a lease time ago (the module docstring)."""
        if self._claims_held:
            self._claims_held = False
            self._claims_from = time.monotonic() + self.db.lease_seconds
            log.info("fleet.claims_held", seconds=self.db.lease_seconds)
        if time.monotonic() < self._claims_from:
            return []
        return await self.leases.claim()

    async def _states(self, handles: set[str]) -> dict[str, m.RunState]:
        """The runs' states as their journaled records give them."""
        replayed = journal.replay(await self.journal.committed(handles))
        return {h: s for h, s in replayed.runs.items() if h in handles}

    # --- follow ---

    async def _follow_loop(self) -> None:
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.db.url, autocommit=True, connect_timeout=5
                )
                async with conn:
                    await conn.execute(f"LISTEN {NOTIFY_JOURNAL}")
                    await conn.execute(f"LISTEN {NOTIFY_COMMANDS}")
                    self._up("follow")
                    while True:
                        await self._pull(conn)
                        await self._take_commands(conn)
                        async for _ in conn.notifies(timeout=self.poll, stop_after=1):
                            pass
            except UNREACHABLE as exc:
                self._unreachable("follow", exc)
                await asyncio.sleep(self.db.retry_every)
            except Exception:  # a bug must not leave the views behind for good
                log.exception("fleet.follow_failed")
                await asyncio.sleep(self.db.retry_every)

    async def sync(self) -> None:
        """Read what was written since the last pull now (a handle spawned elsewhere a moment
        ago, not yet announced here); a database away leaves the views as they are."""
        with contextlib.suppress(*UNREACHABLE):
            async with self.db.pool.connection(timeout=2) as conn:
                await self._pull(conn)

    async def _pull(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Every row written since the last pull, in commit order, to its stream's observer
        (one pull at a time: the follow loop's and `sync`'s)."""
        async with self._pulling:
            await self._pull_rows(conn)

    async def _pull_rows(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(
                "SELECT seq, stream, replica, record FROM luftpause_journal WHERE seq > %s "
                "ORDER BY seq LIMIT %s",
                (min(self._last.values()), _PAGE),
            )
            rows = await cur.fetchall()
            for seq, stream, replica, text in rows:
                if stream not in self._last or seq <= self._last[stream]:
                    continue
                self._last[stream] = seq
                if replica != self.db.replica:
                    self._observers[stream](json.loads(text))
            if rows:
                top = rows[-1][0]
                self._last = {k: max(v, top) for k, v in self._last.items()}
            if len(rows) < _PAGE:
                return

    # --- commands ---

    async def _take_commands(self, conn: psycopg.AsyncConnection[Any]) -> None:
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(
            "SELECT c.id, c.run FROM luftpause_commands c JOIN luftpause_leases l USING (run) "
            "WHERE l.owner = %s AND c.reply IS NULL AND (c.taken IS NULL OR c.taken <> %s)",
            (self.db.replica, self.db.replica),
        )
        here = [i for i, run in await cur.fetchall() if self._drives(run)]
        if not here:
            return
        await cur.execute(
            "UPDATE luftpause_commands SET taken = %s WHERE id = ANY(%s) "
            "RETURNING id, run, kind, args",
            (self.db.replica, here),
        )
        for command_id, run, kind, args in await cur.fetchall():
            task = asyncio.create_task(self._carry_out(command_id, run, kind, json.loads(args)))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)

    def _drives(self, handle: str) -> bool:
        run = self.runtime.runs.get(handle)
        return run is not None and run.here

    async def _carry_out(self, command_id: int, run: str, kind: str, args: dict[str, Any]) -> None:
        reply = await self.runtime.command(run, kind, args)
        while True:
            try:
                async with self.db.pool.connection() as conn:
                    await conn.execute(
                        "UPDATE luftpause_commands SET reply = %s WHERE id = %s",
                        (json.dumps(reply), command_id),
                    )
                return
            except UNREACHABLE as exc:
                self._unreachable("commands", exc)
                await asyncio.sleep(self.db.retry_every)

    async def ask(self, run: str, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        """Have the replica driving `run` carry out a command; its reply."""
        limit = 2 * self.db.lease_seconds + _ASK_MARGIN
        try:
            async with self.db.pool.connection(timeout=limit) as conn:
                cur = conn.cursor(row_factory=tuple_row)
                await cur.execute(
                    "INSERT INTO luftpause_commands (run, kind, args) VALUES (%s, %s, %s) "
                    "RETURNING id",
                    (run, kind, json.dumps(args)),
                )
                row = await cur.fetchone()
                await conn.execute(f"NOTIFY {NOTIFY_COMMANDS}")
        except UNREACHABLE as exc:
            return {"error": f"the journal database is unreachable: {exc}"}
        assert row is not None
        return await self._reply(int(row[0]), run, limit)

    async def _reply(self, command_id: int, run: str, limit: float) -> dict[str, Any]:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            await asyncio.sleep(_ASK_POLL)
            with contextlib.suppress(*UNREACHABLE):
                async with self.db.pool.connection() as conn:
                    cur = conn.cursor(row_factory=tuple_row)
                    await cur.execute(
                        "DELETE FROM luftpause_commands WHERE id = %s AND reply IS NOT NULL "
                        "RETURNING reply",
                        (command_id,),
                    )
                    row = await cur.fetchone()
                if row is not None:
                    reply: dict[str, Any] = json.loads(row[0])
                    return reply
        with contextlib.suppress(*UNREACHABLE):
            async with self.db.pool.connection(timeout=2) as conn:
                await conn.execute("DELETE FROM luftpause_commands WHERE id = %s", (command_id,))
        return {"error": f"the replica driving run {run} did not answer within {limit:g} s"}

    async def _name_taken(self) -> None:
        """Another process took this replica's name while the database was away from this one:
        its leases are that process's now (same owner), so this one stops driving its runs and
        claims nothing until it can hold its name again."""
        driving = {h for h, r in self.runtime.runs.items() if r.here and not r.state.phase.over}
        log.error(
            "fleet.replica_name_taken",
            replica=self.db.replica,
            stopped=len(driving),
            hint="another runtime goes by this --replica; every process needs its own",
        )
        if driving:
            await self.runtime.lost(await self._states(driving))

    # --- the database away ---

    def _unreachable(self, loop: str, exc: BaseException) -> None:
        if loop not in self._down:
            log.warning("fleet.database_unreachable", loop=loop, error=str(exc))
        self._down[loop] = str(exc)
        self._claims_held = True

    def _up(self, loop: str) -> None:
        if self._down.pop(loop, None) is not None:
            log.info("fleet.database_back", loop=loop)
