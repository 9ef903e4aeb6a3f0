"""bench.runtime_retention's journal: the lines it writes for a million runs are the runtime's
own (format 2), each run under its own handle, and retention keeps exactly the live ones."""

from __future__ import annotations

import time
from pathlib import Path

from bench.runtime_retention import AGE, DAY, generate
from luftpause.runtime.core import forks, retention
from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.file import JOURNAL_NAME, JournalFile


class Held:
    def __init__(self, state: m.RunState) -> None:
        self.state = state


def test_the_generated_journal_replays_to_its_finished_and_live_runs(tmp_path: Path) -> None:
    now = time.time()
    generate(tmp_path / JOURNAL_NAME, finished=6, live=2, now=now)
    store = JournalFile(tmp_path)
    records = store.open()
    store.close()
    replayed = j.replay(records)
    assert replayed.ignored == 0
    states = replayed.runs
    live = {h for h, s in states.items() if not s.phase.over}
    assert len(states) == 8 and len(live) == 2
    assert all(s.phase is m.Phase.FINISHED and s.rounds == 1 for h, s in states.items()
               if h not in live)  # fmt: skip
    assert all(states[h].rounds == 2 for h in live)
    first = sorted(states)[0]
    kinds = [r["type"] for r in forks.expand(records) if r["run"] == first]
    assert kinds == ["spawned", "turn", "call", "round", "finished"]
    calls = [r["call"] for r in forks.expand(records) if r["type"] == "call"]
    assert len(calls) == len(set(calls))  # each run its own call ids
    held = {h: Held(s) for h, s in states.items()}
    assert retention.expired(held, now, AGE) == set(states) - live
    assert retention.expired(held, now - 29 * DAY, AGE) == set()
