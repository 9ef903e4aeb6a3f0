"""The run tree of GET /status: own work and subtree totals, from a golden journal."""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.runtime.core import journal, machine, status_tree
from tests.runtime.make_golden import GOLDEN


@dataclass
class Node:
    state: machine.RunState


def test_a_parent_shows_its_child_and_totals_over_both() -> None:
    decoder = journal.JournalDecoder()
    data = (GOLDEN / "tree_with_torn_tail.jsonl").read_bytes()
    runs = journal.replay(decoder.feed(data) + decoder.flush()).runs
    out = status_tree.status({h: Node(s) for h, s in runs.items()})
    [parent] = [n for n in out["tree"] if n["handle"] == "run-parent"]
    [child] = parent["children"]
    assert child["handle"] == "run-child" and child["own"]["toolCalls"] == 1
    assert parent["own"]["turns"] == 2 and parent["subtree"]["turns"] == 3
    assert parent["subtree"]["toolCalls"] == 2 and parent["subtree"]["toolSeconds"] == 0.5
    assert out["byState"] == {"finished": 1, "running": 1, "cancelled": 1, "failed": 1}
