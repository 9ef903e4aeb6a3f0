"""Retention: which finished trees leave the live journal, how the records split, the file
journal rewritten atomically with its archive beside it while appends go on, and a real runtime
letting go of old trees (and their tasks) and replaying only the rest."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from luftpause.common.auth import Identity
from luftpause.runtime.core import forks, retention
from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.file import JournalFile
from luftpause.runtime.loop.runtime import Runtime, new_handle
from luftpause.runtime.server.tasks import TASKS_NAME, TasksExtension
from luftpause.testkit.engine.server import RunningServer
from tests.runtime.loopback import MODEL, FakeMcp, runtime_on

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

    def held_split(*args: Any) -> Any:
        if not reading.is_set():  # the pass's first split: the journal as it was read
            reading.set()
            assert go.wait(10)
        return split(*args)

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


def clocked_runtime(
    state_dir: Path, model: RunningServer, tools: FakeMcp, clock: list[float]
) -> AbstractAsyncContextManager[Runtime]:
    """A real `Runtime` (journal, model, tools) whose clock the test moves."""
    return runtime_on(state_dir, model.url, [tools.url], clock=lambda: clock[0])


def spec_of(tool: str, parent: str | None = None) -> m.RunSpec:
    return m.RunSpec(handle=new_handle(), task="t", model=MODEL, tools=(tool,), parent=parent)


async def test_the_runtime_lets_go_of_old_finished_trees_and_replays_only_the_rest(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    clock = [time.time()]
    async with clocked_runtime(tmp_path, model, tools, clock) as runtime:
        old = await runtime.spawn(spec_of("lookup"))
        kid = await runtime.spawn(spec_of("lookup", parent=old))
        parent = await runtime.spawn(spec_of("lookup"))
        busy = await runtime.spawn(spec_of("deep_search", parent=parent))  # 5 s: still live
        done = await runtime.await_runs([old, kid, parent], "all", 10)
        assert {s["state"] for s in done} == {"finished"}
        clock[0] += 2 * DAY
        assert await runtime.retain(DAY) == sorted([old, kid])
        assert runtime.summary(old)["state"] == "unknown"
        assert set(runtime.runs) == {parent, busy}
    async with clocked_runtime(tmp_path, model, tools, clock) as again:
        assert set(again.runs) == {parent, busy}
    [archive] = (tmp_path / "archive").glob("runs-*.jsonl")
    decoder = j.JournalDecoder()
    assert {r["run"] for r in forks.expand(decoder.feed(archive.read_bytes()))} == {old, kid}


async def test_the_tasks_of_runs_let_go_leave_the_task_file_with_them(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    made = [
        {"v": 1, "type": "task", "task": "t-old", "run": "run-old", "at": "2026-01-01T00:00:00Z"},
        {"v": 1, "type": "task", "task": "t-new", "run": "run-new", "at": "2026-01-01T00:00:01Z"},
        {"v": 1, "type": "taskEnded", "task": "t-old", "status": "cancelled", "error": None},
    ]
    task_file = JournalFile(tmp_path, TASKS_NAME, key=retention.task_of)
    task_file.open()
    for record in made:
        await task_file.append(record)
    task_file.close()
    async with clocked_runtime(tmp_path, model, tools, [time.time()]) as runtime:
        task_file = JournalFile(tmp_path, TASKS_NAME, key=retention.task_of)
        extension = TasksExtension(runtime, task_file, spawn=_no_spawn)
        await extension.resume()
        assert await extension.retain({"run-old"}) == 1
        assert set(extension.tasks) == {"t-new"}
        extension.close()
    left = [r["task"] for r in j.JournalDecoder().feed((tmp_path / TASKS_NAME).read_bytes())]
    assert set(left) == {"t-new"}
    [archive] = (tmp_path / "archive").glob("tasks-*.jsonl")
    assert [r["type"] for r in j.JournalDecoder().feed(archive.read_bytes())] == [
        "task",
        "taskEnded",
    ]


async def _no_spawn(args: dict[str, Any], caller: str, identity: Identity) -> str:
    raise AssertionError("no run is made here")
