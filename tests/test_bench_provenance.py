"""What every benchmark result records of how it was made (`bench.common`)."""

from __future__ import annotations

import re
import subprocess
import sys

from bench.common import LoadWatch, command, provenance, rotated, versions


def test_provenance_names_the_commit_the_command_and_the_installed_peers() -> None:
    made = provenance()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert made["commit"] == head and re.fullmatch(r"[0-9a-f]{40}", made["commit"])
    assert isinstance(made["dirty"], bool)
    assert made["versions"]["openai"] and "not-a-distribution" not in versions(
        ("openai", "not-a-distribution")
    )
    assert made["cpus"] and made["load_1m"] >= 0 and made["command"]


def test_the_command_is_quoted_as_a_shell_takes_it() -> None:
    assert command(["bench/x.py", "--out", "a b.json"]) == "bench/x.py --out 'a b.json'"


def test_a_load_watch_reports_the_load_and_the_busy_share_over_its_span() -> None:
    with LoadWatch() as load:
        # Busy for 0.3 s whatever the host's speed: the summary rounds seconds to a tenth.
        busy = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.3: pass"
        subprocess.run([sys.executable, "-c", busy], check=True)
    summary = load.summary()
    assert set(summary) == {"load_1m_start", "load_1m_end", "cpu_busy_share", "seconds"}
    assert summary["seconds"] > 0
    assert summary["cpu_busy_share"] is not None and 0.0 < summary["cpu_busy_share"] <= 1.0


def test_arms_rotate_so_each_runs_first_in_turn() -> None:
    arms = ["a", "b", "c"]
    assert [rotated(arms, r)[0] for r in range(4)] == ["a", "b", "c", "a"]
    assert sorted(rotated(arms, 5)) == arms
