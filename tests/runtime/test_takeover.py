"""The runtime's side of a take-over (`Runtime.take`, `lost`, `observe`), in this process: a
run is driven by at most one task here, whatever the lease loop hands over while the run's
first or last record is still being journaled; a view follows the records another replica
writes and is driven once taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from luftpause.runtime.core import journal
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.file import JournalFile
from luftpause.runtime.loop.runtime import Runtime, new_handle
from luftpause.testkit.engine.server import RunningServer
from tests.runtime.loopback import MODEL, FakeMcp, runtime_on
from tests.runtime.test_runtime import WAIT, finish, records, until


class GatedJournal(JournalFile):
    """A journal file whose appends of the `held` record types wait for `gate`."""

    def __init__(self, state_dir: Path, held: set[str]) -> None:
        super().__init__(state_dir)
        self.held = held
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def append(self, record: dict[str, Any], *, retry: bool = True) -> None:
        if record.get("type") in self.held:
            self.waiting.set()
            await self.gate.wait()
        await super().append(record, retry=retry)


@asynccontextmanager
async def gated_runtime(
    state_dir: Path, model: RunningServer, tools: FakeMcp, held: set[str]
) -> AsyncIterator[tuple[Runtime, GatedJournal]]:
    store = GatedJournal(state_dir, held)
    async with runtime_on(state_dir, model.url, [tools.url], journal=store) as runtime:
        yield runtime, store


async def spawned_and_held(runtime: Runtime, store: GatedJournal) -> tuple[str, m.RunState]:
    """A run spawned here and waiting at its held record; its state as journaled so far."""
    handle = await runtime.spawn(spec())
    async with asyncio.timeout(WAIT):
        await store.waiting.wait()
    return handle, journal.replay(records(store.path.parent)).runs[handle]


def spec() -> m.RunSpec:
    return m.RunSpec(handle=new_handle(), task="find otters", model=MODEL, tools=("lookup",))


def kinds(state_dir: Path, handle: str) -> list[str]:
    return [r["type"] for r in records(state_dir) if r["run"] == handle]


async def test_a_run_whose_finished_record_is_on_its_way_is_not_taken_again(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with gated_runtime(tmp_path, model, tools, {"finished"}) as (runtime, store):
        handle, journaled = await spawned_and_held(runtime, store)  # over, lease still held
        assert runtime.take({handle: journaled}) == []
        store.gate.set()
        await finish(runtime, handle)
    assert kinds(tmp_path, handle).count("finished") == 1
    assert tools.stats.calls["lookup"] == 1  # its one round, once


async def test_a_run_being_begun_here_is_not_taken_before_its_spawn_returns(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with gated_runtime(tmp_path, model, tools, {"spawned"}) as (runtime, store):
        s = spec()
        spawning = asyncio.create_task(runtime.spawn(s))
        async with asyncio.timeout(WAIT):
            await store.waiting.wait()  # its lease would be held, the run not yet known
        assert runtime.take({s.handle: m.start(s)}) == []
        store.gate.set()
        handle = await spawning
        await finish(runtime, handle)
    assert kinds(tmp_path, handle).count("spawned") == 1
    assert kinds(tmp_path, handle).count("finished") == 1


async def test_a_view_follows_the_records_written_elsewhere_and_is_driven_once_taken(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    s = spec()
    spawned = journal.spawned_record(s)
    async with gated_runtime(tmp_path, model, tools, set()) as (runtime, _):
        runtime.observe(spawned)  # another replica spawned it
        assert not runtime.runs[s.handle].here
        [summary] = await runtime.await_runs([s.handle], "all", 0.05)
        assert summary["state"] == "running"  # a view: nothing drives it here
        await runtime.journal.append(spawned)  # as the database holds it for the taker
        assert runtime.take({s.handle: m.start(s)}) == [s.handle]
        summary = await finish(runtime, s.handle)
    assert summary["state"] == "finished"
    assert kinds(tmp_path, s.handle).count("finished") == 1


async def test_a_run_whose_lease_was_lost_stops_here_without_journaling(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with gated_runtime(tmp_path, model, tools, {"finished"}) as (runtime, store):
        handle, elsewhere = await spawned_and_held(runtime, store)
        await runtime.lost({handle: elsewhere})

        def stopped() -> bool:
            task = runtime.runs[handle].task
            return task is None or task.done()

        await until(stopped)
        assert not runtime.runs[handle].here
        assert runtime.runs[handle].state == elsewhere
        store.gate.set()
    assert "finished" not in kinds(tmp_path, handle)
