"""The journal as the planner reads it: every record read back on start, appended, or written
by another replica is fed to the ledger (`turn_samples.Ledger`), and each appended turn's USD
to the spend metric.

Shell module: a wrapper of a `Store` (the file or the database) that the runtime writes through;
everything but `open`, `append` and `learn` is the inner journal's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from luftpause.runtime.core.turn_samples import Ledger
from luftpause.runtime.journal.file import Store


class ObservedJournal:
    """A journal whose records the ledger learns from: read back on `open`, appended (each
    appended turn's cost then goes to `spent`), and written by another replica (`learn`).
    Everything else is the inner journal's."""

    def __init__(self, inner: Store, ledger: Ledger, spent: Callable[[str, float], None]) -> None:
        self.path = getattr(inner, "path", None)  # the file's, for a file journal
        self.inner = inner
        self._inner = inner
        self._ledger = ledger
        self._spent = spent

    def open(self) -> list[dict[str, Any]]:
        records = self._inner.open()
        for record in records:
            self._ledger.feed(record)
        return records

    async def append(self, record: dict[str, Any], *, retry: bool = True) -> None:
        # Learned before the write: the run's state already holds the record's step, and a
        # forecast during the write must see both alike. A record not written (`retry` false)
        # begins no run, so what was learned of it stays unused.
        spent = self._ledger.feed(record)
        await self._inner.append(record, retry=retry)
        for s in spent:
            self._spent(s.model, s.usd)

    def learn(self, record: dict[str, Any]) -> None:
        """A record another replica wrote."""
        self._ledger.feed(record)

    @property
    def failing(self) -> str | None:
        return self._inner.failing

    async def committed(self, handles: Iterable[str] | None = None) -> list[dict[str, Any]]:
        return await self._inner.committed(handles)

    async def archive(self, handles: set[str]) -> int:
        return await self._inner.archive(handles)

    def close(self) -> None:
        self._inner.close()
