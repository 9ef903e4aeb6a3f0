"""Who drives each unfinished run when several replicas share one journal database.

Shell module over `luftpause_leases` (`postgres`' schema), with its two pure rules first.
Each unfinished run has one lease row: its owner (a replica's name), an epoch (raised by each
take-over) and an expiry. The spawning replica writes it with the spawned record; the finished
record drops it. The owner renews every lease it holds in one statement, every third of the
lease time; a replica that could not renew for a whole lease time holds nothing it can still
write (`postgres`' fencing refuses its records), and says so.

Take-over: a lease past its expiry is free. Every replica looks for free leases as often as it
renews and claims its share of them (`share`), the rows locked `SKIP LOCKED` so two replicas
never claim the same run; the claim raises the epoch and sets the new owner in one statement.
The claimer then reads the run's records (everything its old owner committed is in: a commit
and a claim of the same run are serialised on the lease row) and resumes the run from its last
journaled point under `resend`'s rules.
"""

from __future__ import annotations

import math

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import PoolTimeout

from luftpause.runtime.journal.postgres import Database


def share(free: int, replicas: int) -> int:
    """How many of `free` leases one of `replicas` live replicas claims at a time: an even
    share, at least one while any is free, so the runs of a dead replica spread over the rest."""
    if free <= 0:
        return 0
    return max(1, math.ceil(free / max(1, replicas)))


def renew_every(lease_seconds: float) -> float:
    """How often the owner renews (and looks for free leases): three times a lease time, so
    one late or failed renewal does not lose a lease."""
    return lease_seconds / 3


class Leases:
    """This replica's side of the lease table."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def renew(self) -> set[str]:
        """Extend every lease this replica holds; the runs it holds."""
        async with self.db.pool.connection(timeout=self.db.lease_seconds) as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(
                "UPDATE luftpause_leases SET expires = now() + make_interval(secs => %s) "
                "WHERE owner = %s RETURNING run",
                (self.db.lease_seconds, self.db.replica),
            )
            return {row[0] for row in await cur.fetchall()}

    async def claim(self) -> list[str]:
        """Take this replica's share of the expired leases; the runs taken."""
        async with self.db.pool.connection(timeout=self.db.lease_seconds) as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(
                "SELECT count(*) FILTER (WHERE expires < now()), "
                "count(DISTINCT owner) FILTER (WHERE expires >= now() AND owner <> %s) "
                "FROM luftpause_leases",
                (self.db.replica,),
            )
            row = await cur.fetchone()
            free, others = (int(row[0]), int(row[1])) if row else (0, 0)
            n = share(free, others + 1)
            if n == 0:
                return []
            await cur.execute(
                "UPDATE luftpause_leases l SET owner = %s, epoch = l.epoch + 1, "
                "expires = now() + make_interval(secs => %s) WHERE l.run IN ("
                " SELECT run FROM luftpause_leases WHERE expires < now() ORDER BY expires"
                " LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING l.run",
                (self.db.replica, self.db.lease_seconds, n),
            )
            return sorted(row[0] for row in await cur.fetchall())


UNREACHABLE: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    PoolTimeout,
    OSError,
)
