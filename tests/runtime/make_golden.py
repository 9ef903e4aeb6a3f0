"""Regenerate the expected states of the golden journals: `python -m tests.runtime.make_golden`.

Only after a deliberate change of replay; the tests assert that replay reproduces these files.
"""

from __future__ import annotations

import json
from pathlib import Path

from luftpause.runtime.core import journal, machine

GOLDEN = Path(__file__).with_name("golden")


def expected(path: Path) -> dict[str, object]:
    decoder = journal.JournalDecoder()
    records = decoder.feed(path.read_bytes()) + decoder.flush()
    return canonical_state(journal.replay(records))


def canonical_state(replayed: journal.Replayed) -> dict[str, object]:
    """What a golden journal's `.state.json` holds of its replay."""
    return {
        "ignored": replayed.ignored,
        "runs": {h: json.loads(machine.canonical(s)) for h, s in replayed.runs.items()},
    }


if __name__ == "__main__":
    for path in sorted(GOLDEN.glob("*.jsonl")):
        out = path.with_suffix(".state.json")
        out.write_text(json.dumps(expected(path), indent=1, sort_keys=True) + "\n")
        print(out)
