"""A PostgreSQL server for a test module (`server`), and an empty journal schema per test
(`empty`): the tables dropped, so the next `Database.connect` makes them anew."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from luftpause.testkit.postgres import Postgres

TABLES = ("luftpause_journal", "luftpause_archive", "luftpause_leases", "luftpause_commands")


@contextmanager
def server() -> Iterator[Postgres]:
    pg = Postgres.create()
    try:
        yield pg.start()
    finally:
        pg.close()


def empty(pg: Postgres) -> str:
    """The server's URL, its journal tables dropped."""
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {', '.join(TABLES)}")
    return pg.url
