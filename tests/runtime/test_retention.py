"""Retention: which finished trees leave the live journal, how the records split, and the file
journal rewritten atomically with its archive beside it."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from luftpause.runtime import forks, retention
from luftpause.runtime import journal as j
from luftpause.runtime import machine as m
from luftpause.runtime.store import JournalFile

DAY = 86400.0


@dataclass
class Held:
    state: m.RunState


def run(handle: str, parent: str | None = None, ended: float | None = None) -> Held:
    state = m.start(m.RunSpec(handle=handle, task="t", model="sim", parent=parent))
    if ended is not None:
        state = replace(state, phase=m.Phase.FINISHED, ended_at=ended)
    return Held(state)


def test_a_tree_leaves_only_once_every_run_in_it_ended_before_the_age() -> None:
    now = 10 * DAY
    runs = {
        "old": run("old", ended=1.0),
        "old-kid": run("old-kid", "old", ended=2.0),
        "fresh": run("fresh", ended=now - 60),
        "parent": run("parent", ended=1.0),
        "live-kid": run("live-kid", "parent"),
        "live": run("live", ended=None),
    }
    assert retention.expired(runs, now, DAY) == {"old", "old-kid"}


def test_a_finished_child_of_a_live_parent_stays() -> None:
    runs = {"p": run("p"), "k": run("k", "p", ended=1.0)}
    assert retention.expired(runs, 10 * DAY, DAY) == set()


def test_age_zero_keeps_every_run_and_a_run_without_an_end_time_stays() -> None:
    runs = {"a": run("a", ended=1.0), "b": run("b", ended=0.0)}
    assert retention.expired(runs, 10 * DAY, 0) == set()
    assert retention.expired(runs, 10 * DAY, DAY) == {"a"}


def spawned(handle: str) -> dict[str, object]:
    return j.spawned_record(m.RunSpec(handle=handle, task="t", model="sim"))


def test_split_keeps_order_and_takes_a_mixed_batch_apart() -> None:
    whole = forks.batch_record([spawned("a1"), spawned("a2")])
    mixed = forks.batch_record([spawned("a3"), spawned("b2")])
    records = [spawned("b1"), whole, mixed]
    live, archived = retention.split(records, {"a1", "a2", "a3"})
    assert live == [spawned("b1"), spawned("b2")]
    assert archived == [whole, spawned("a3")]


async def test_the_file_journal_keeps_only_live_runs_and_archives_the_rest(tmp_path: Path) -> None:
    store = JournalFile(tmp_path)
    store.open()
    for h in ("old", "live"):
        await store.append(spawned(h))
    assert await store.archive({"old"}) == 1
    await store.append(spawned("after"))  # appends go on on the new file
    store.close()
    again = JournalFile(tmp_path)
    assert [r["run"] for r in again.open()] == ["live", "after"]
    again.close()
    [archive] = (tmp_path / "archive").glob("runs-*.jsonl")
    decoder = j.JournalDecoder()
    assert [r["run"] for r in decoder.feed(archive.read_bytes())] == ["old"]
    assert not list(tmp_path.glob("*.new"))


async def test_appends_go_on_during_a_pass_and_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JournalFile(tmp_path)
    store.open()
    for h in ("old", "live"):
        await store.append(spawned(h))
    reading, go = threading.Event(), threading.Event()
    split = retention.split

    def held_split(records: Any, gone: set[str]) -> Any:
        if not reading.is_set():  # the pass's first split: the journal as it was read
            reading.set()
            assert go.wait(10)
        return split(records, gone)

    monkeypatch.setattr(retention, "split", held_split)
    passing = asyncio.create_task(store.archive({"old"}))
    assert await asyncio.to_thread(reading.wait, 10)
    async with asyncio.timeout(5):  # not held by the pass under way
        await store.append(spawned("during"))
    go.set()
    assert await passing == 1
    await store.append(spawned("after"))
    store.close()
    again = JournalFile(tmp_path)
    assert [r["run"] for r in again.open()] == ["live", "during", "after"]
    again.close()
