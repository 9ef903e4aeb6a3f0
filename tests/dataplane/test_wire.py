"""Dataplane values become the scheduler's messages; a Resync always fits in one message."""

from __future__ import annotations

from luftpause.dataplane import wire
from luftpause.dataplane.identity import ServiceClass
from luftpause.dataplane.reply import ReplySummary, Usage
from luftpause.dataplane.runs import RunTable, TurnRecord
from luftpause.rpc import scheduler_pb2 as pb


def turn(turn_id: str, run_id: str) -> TurnRecord:
    return TurnRecord(
        turn_id=turn_id,
        run_id=run_id,
        replica_id="engine-a",
        model="m",
        service_class=ServiceClass.INTERACTIVE,
        caller="c",
    )


def test_finished_event_carries_usage_reason_and_tool_calls() -> None:
    summary = ReplySummary(
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=1, completion_tokens=2, cached_tokens=3),
        tool_call_ids=("a",),
        tool_calls=True,
    )
    event = wire.finished("t", "r", summary)
    assert event.WhichOneof("kind") == "finished"
    assert event.finished.tool_calls and event.finished.finish_reason == "tool_calls"
    assert (event.finished.usage.prompt_tokens, event.finished.usage.cached_tokens) == (1, 3)


def test_finished_event_without_usage_leaves_it_unset() -> None:
    event = wire.finished("t", "r", ReplySummary(finish_reason="stop"))
    assert not event.finished.HasField("usage")


def test_oversized_resync_leaves_out_the_longest_idle_runs_first() -> None:
    table = RunTable()
    for i in range(200):
        table.turn_placed(turn(f"t{i}", f"idle-{i:03d}"), now=float(i))
        table.turn_ended(f"t{i}", tool_paused=False, now=float(i))
    table.turn_placed(turn("p", "paused"), now=0.0)
    table.turn_ended("p", tool_paused=True, now=0.0)
    table.turn_placed(turn("busy", "busy"), now=0.0)
    full = wire.resync_request(table.snapshot(now=300.0), "dp")
    cut = wire.resync_request(table.snapshot(now=300.0), "dp", max_bytes=full.ByteSize() // 2)
    kept = {r.run_id for r in cut.runs}
    assert cut.ByteSize() <= full.ByteSize() // 2
    assert {"paused", "busy"} <= kept
    assert "idle-199" in kept and "idle-000" not in kept
    assert [t.turn_id for t in cut.turns] == ["busy"]
    assert len(full.runs) == 202
    phases = {r.run_id: r.phase for r in full.runs}
    assert phases["paused"] == pb.RUN_PHASE_TOOL_PAUSED


def test_a_resync_carries_the_saved_slot_files_and_a_placement_the_run_it_saves() -> None:
    table = RunTable()
    table.slot_saved("engine-a", "f0.bin", "run-1", now=1.0)
    [saved] = wire.resync_request(table.snapshot(now=3.5), "dp").saved
    assert (saved.replica_id, saved.file, saved.run_id, saved.age_seconds) == (
        "engine-a",
        "f0.bin",
        "run-1",
        2.5,
    )
    reply = pb.AdmitReply(replica_id="engine-a", slot_save="f0.bin", slot_save_run="run-1")
    assert wire.placement(reply).slot_save_run == "run-1"
    assert wire.placement(pb.AdmitReply(replica_id="engine-a")).slot_save_run is None
