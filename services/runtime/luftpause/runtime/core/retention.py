"""Which finished runs leave the live journal, and how a journal's records split when they do.

Pure module: no I/O, no clock reads (the time comes in as `now`); imports `budget` and `forks`.
A run leaves with its whole tree or not at all: a tree goes once every run in it is over and
the last of them ended more than `age` seconds ago (a run whose end has no time, from a journal
older than the `at` field, stays). A finished child of a live parent stays,
since the parent's budgets count its subtree's spend; a finished parent of a live child stays,
since the child's budgets count up through it.

`split` keeps the journal's order on both sides; a record goes by its run (`run_of`), or in the
task file by its task (`task_of`: the tasks of runs let go leave with them). A `batch` line
whose runs all go or all stay moves whole; one that mixes them is taken apart into its records
(they were committed together already, and a snapshot is written whole or not at all).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from luftpause.runtime.core import budget, forks
from luftpause.runtime.core.budget import HasState

KEEP_FOREVER = 0.0


def expired(runs: Mapping[str, HasState], now: float, age: float) -> set[str]:
    """The runs whose trees are all over and ended more than `age` seconds before `now`."""
    if age <= KEEP_FOREVER:
        return set()
    kids = budget.children(runs)
    gone: set[str] = set()
    for handle, run in runs.items():
        parent = run.state.spec.parent
        if parent is not None and parent in runs:
            continue  # not a root here: its tree is judged from its root
        tree = budget.subtree(handle, kids)
        states = [runs[h].state for h in tree]
        if not all(s.phase.over and s.ended_at for s in states):
            continue  # live, or ended at a time the journal does not hold (format 1): kept
        if max(float(s.ended_at or 0.0) for s in states) < now - age:
            gone.update(tree)
    return gone


def run_of(record: Mapping[str, Any]) -> str:
    """What a run journal's record is kept by: its run."""
    return str(record.get("run"))


def task_of(record: Mapping[str, Any]) -> str:
    """What a task file's record is kept by: its task (`tasks`)."""
    return str(record.get("task"))


def split(
    records: Iterable[dict[str, Any]],
    gone: set[str],
    key: Callable[[Mapping[str, Any]], str] = run_of,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(live, archived): the records whose `key` stays, and those whose key is in `gone`, in
    order."""
    live: list[dict[str, Any]] = []
    archived: list[dict[str, Any]] = []
    for record in records:
        keys = {key(r) for r in forks.expand([record])}
        if keys <= gone:
            archived.append(record)
        elif not keys & gone:
            live.append(record)
        else:
            for r in forks.expand([record]):
                (archived if key(r) in gone else live).append(r)
    return live, archived


def expand(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with every batch taken apart (`forks.expand`), as a list."""
    return list(forks.expand(records))
