"""The run table: phases as turns go, idle expiry, the snapshot a Resync carries."""

from __future__ import annotations

import pytest

from luftpause.dataplane.identity import ServiceClass
from luftpause.dataplane.runs import Phase, RunRecord, RunTable, TurnRecord

MINUTE = 60.0


def turn(
    turn_id: str, run_id: str = "run-1", replica: str = "engine-a", size: int = 0
) -> TurnRecord:
    return TurnRecord(
        turn_id=turn_id,
        run_id=run_id,
        replica_id=replica,
        model="m",
        service_class=ServiceClass.BATCH,
        caller="me",
        request_bytes=size,
    )


def test_a_turns_request_is_pending_on_its_replica_until_its_first_token_or_its_end() -> None:
    table = RunTable()
    table.turn_placed(turn("t1", "r1", size=500), now=0.0)
    table.turn_placed(turn("t2", "r2", size=300), now=0.0)
    table.turn_placed(turn("t3", "r3", replica="engine-b", size=200), now=0.0)
    assert table.pending == {"engine-a": 800, "engine-b": 200}
    table.turn_read("t1")
    table.turn_read("t1")  # once only
    assert table.pending == {"engine-a": 300, "engine-b": 200}
    table.turn_ended("t1", tool_paused=False, now=1.0)  # read already: nothing more
    table.turn_ended("t2", tool_paused=False, now=1.0)  # failed before it was read
    table.turn_ended("t3", tool_paused=False, now=1.0)
    assert table.pending == {} and table.read == set()


def test_run_generates_while_its_turn_is_in_flight() -> None:
    table = RunTable()
    table.turn_placed(turn("t1"), now=0.0)
    assert table.phase("run-1") is Phase.GENERATING
    assert set(table.turns) == {"t1"}


def test_reply_with_tool_calls_pauses_the_run() -> None:
    table = RunTable()
    table.turn_placed(turn("t1"), now=0.0)
    table.turn_ended("t1", tool_paused=True, now=1.0)
    assert table.phase("run-1") is Phase.TOOL_PAUSED
    assert table.turns == {}


def test_normal_finish_or_failure_leaves_the_run_idle() -> None:
    table = RunTable()
    table.turn_placed(turn("t1"), now=0.0)
    table.turn_ended("t1", tool_paused=False, now=1.0)
    assert table.phase("run-1") is Phase.IDLE


def test_run_with_two_turns_in_flight_generates_until_both_end() -> None:
    table = RunTable()
    table.turn_placed(turn("t1"), now=0.0)
    table.turn_placed(turn("t2"), now=0.0)
    table.turn_ended("t1", tool_paused=True, now=1.0)
    assert table.phase("run-1") is Phase.GENERATING
    table.turn_ended("t2", tool_paused=True, now=2.0)
    assert table.phase("run-1") is Phase.TOOL_PAUSED


def test_next_turn_moves_the_run_to_its_new_replica() -> None:
    table = RunTable()
    table.turn_placed(turn("t1"), now=0.0)
    table.turn_ended("t1", tool_paused=False, now=1.0)
    table.turn_placed(turn("t2", replica="engine-b"), now=2.0)
    assert table.runs["run-1"].replica_id == "engine-b"


def test_snapshot_carries_idle_seconds_and_turns_in_flight() -> None:
    table = RunTable()
    table.turn_placed(turn("t1", run_id="paused"), now=0.0)
    table.turn_ended("t1", tool_paused=True, now=10.0)
    table.turn_placed(turn("t2", run_id="busy"), now=20.0)
    snap = table.snapshot(now=25.0)
    idle = {run.run_id: (run.phase, seconds) for run, seconds in snap.runs}
    assert idle == {"paused": (Phase.TOOL_PAUSED, 15.0), "busy": (Phase.GENERATING, 5.0)}
    assert [t.turn_id for t in snap.turns] == ["t2"]


def test_runs_idle_over_thirty_minutes_are_left_out_and_pruned() -> None:
    table = RunTable()
    table.turn_placed(turn("t1", run_id="old"), now=0.0)
    table.turn_ended("t1", tool_paused=True, now=0.0)
    table.turn_placed(turn("t2", run_id="long"), now=0.0)  # in flight: never dropped
    assert [r.run_id for r, _ in table.snapshot(now=31 * MINUTE).runs] == ["long"]
    assert table.prune(now=31 * MINUTE) == 1
    assert set(table.runs) == {"long"}


def test_ended_run_is_forgotten_and_its_late_turn_end_does_not_revive_it() -> None:
    table = RunTable()
    table.turn_placed(turn("t1"), now=0.0)
    table.end_run("run-1")
    table.turn_ended("t1", tool_paused=True, now=1.0)
    assert table.phase("run-1") is None and table.turns == {}


def test_run_record_refuses_a_phase_that_contradicts_its_turns() -> None:
    with pytest.raises(ValueError):
        RunRecord(
            run_id="r",
            replica_id="e",
            phase=Phase.IDLE,
            service_class=ServiceClass.BATCH,
            caller="",
            since=0.0,
            in_flight=1,
        )


def test_load_counts_turns_in_flight_per_replica_and_forgets_an_idle_replica() -> None:
    table = RunTable()
    table.turn_placed(turn("t1", "r1", replica="a"), now=0.0)
    table.turn_placed(turn("t2", "r2", replica="a"), now=0.0)
    table.turn_placed(turn("t3", "r3", replica="b"), now=0.0)
    assert table.load == {"a": 2, "b": 1}
    table.end_run("r1")  # a run's end leaves its turn counted until the turn ends
    table.turn_ended("t1", tool_paused=False, now=1.0)
    table.turn_ended("t3", tool_paused=False, now=1.0)
    table.turn_ended("t3", tool_paused=False, now=1.0)  # reported twice: counted once
    assert table.load == {"a": 1}


def test_a_turn_is_placed_once() -> None:
    table = RunTable()
    table.turn_placed(turn("t1"), now=0.0)
    with pytest.raises(ValueError, match="already placed"):
        table.turn_placed(turn("t1"), now=0.0)
    assert table.load == {"engine-a": 1}


def test_saved_slot_files_are_in_the_snapshot_until_restored() -> None:
    table = RunTable()
    table.slot_saved("engine-a", "f0.bin", "run-1", now=10.0)
    table.slot_saved("engine-a", "f1.bin", "run-2", now=12.0)
    table.slot_saved("engine-a", "f0.bin", "run-3", now=14.0)  # overwritten: the last save
    table.slot_restored("engine-a", "f1.bin")
    [(saved, age)] = table.snapshot(now=20.0).saved
    assert (saved.file, saved.run_id, age) == ("f0.bin", "run-3", 6.0)
