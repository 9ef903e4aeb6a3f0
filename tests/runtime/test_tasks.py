"""The task file's replay: pure, no event loop."""

from __future__ import annotations

from luftpause.runtime.server import tasks


def test_a_task_file_replays_to_each_task_with_its_run_and_how_it_ended() -> None:
    records = [
        {"v": 1, "type": "task", "task": "t1", "run": "r1", "at": "2026-01-01T00:00:00Z"},
        {"v": 1, "type": "task", "task": "t2", "run": "r2", "at": "2026-01-01T00:00:01Z"},
        {"v": 1, "type": "taskEnded", "task": "t1", "status": "failed", "error": "restarted"},
        {"v": 1, "type": "taskEnded", "task": "nope", "status": "cancelled", "error": None},
    ]
    replayed = tasks.replay(records)
    assert replayed["t1"] == tasks.TaskEntry(
        task_id="t1",
        run="r1",
        created_at="2026-01-01T00:00:00Z",
        ended="failed",
        error="restarted",
    )
    assert replayed["t2"].ended is None and set(replayed) == {"t1", "t2"}
