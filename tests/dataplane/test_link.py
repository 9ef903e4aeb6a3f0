"""The scheduler link: Resync before every Report stream, turns held through outages."""

from __future__ import annotations

import asyncio

import pytest

from luftpause.dataplane import link, wire
from luftpause.rpc import scheduler_pb2 as pb
from tests.dataplane.conftest import Stack


def kinds_after(calls: list[str], start: int) -> list[str]:
    return [c for c in calls[start:] if c in ("resync", "session", "admit", "session-broken")]


async def test_startup_sends_resync_before_opening_report(stack: Stack) -> None:
    assert stack.scheduler.calls[:2] == ["resync", "session"]
    assert stack.scheduler.resyncs[0].dataplane_id == "dp-test"
    assert list(stack.scheduler.resyncs[0].runs) == []


async def test_broken_report_stream_reconnects_with_resync_first(stack: Stack) -> None:
    async with asyncio.timeout(10):
        await stack.post(stack.chat(), **{"x-luftpause-run-id": "run-1"})
        mark = len(stack.scheduler.calls)
        stack.scheduler.break_sessions()
        await stack.scheduler.changes.until(
            lambda: kinds_after(stack.scheduler.calls, mark)[-2:] == ["resync", "session"]
        )
        await stack.dp.link.wait_ready()
    assert kinds_after(stack.scheduler.calls, mark) == ["session-broken", "resync", "session"]
    runs = {r.run_id: r for r in stack.scheduler.resyncs[-1].runs}
    assert runs["run-1"].phase == pb.RUN_PHASE_IDLE
    assert runs["run-1"].replica_id == "engine-a"
    assert runs["run-1"].service_class == pb.SERVICE_CLASS_INTERACTIVE


async def test_events_after_a_reconnect_go_on_the_new_stream(stack: Stack) -> None:
    async with asyncio.timeout(10):
        stack.scheduler.break_sessions()
        await stack.scheduler.changes.until(lambda: stack.scheduler.calls.count("session") == 2)
        await stack.dp.link.wait_ready()
        await stack.post(stack.chat())
        events = await stack.turn_events(stack.scheduler.admits[-1].turn_id, 3)
    assert events == ["started", "first_token", "finished"]


async def test_events_queued_during_a_write_go_out_as_one_message(stack: Stack) -> None:
    async with asyncio.timeout(10):
        await stack.dp.link.wait_ready()
        before = len(stack.scheduler.events)
        for i in range(5):
            stack.dp.link.report(wire.run_ended(f"run-{i}"))
        await stack.scheduler.changes.until(lambda: len(stack.scheduler.events) == before + 5)
    assert stack.scheduler.batches[-1] == 5
    ended = [e.run_id for e in stack.scheduler.events[before:]]
    assert ended == [f"run-{i}" for i in range(5)]


async def test_started_and_first_token_ride_with_the_turns_finished_event(stack: Stack) -> None:
    async with asyncio.timeout(10):
        await stack.dp.link.wait_ready()
        await stack.post(stack.chat())
        turn_id = stack.scheduler.admits[-1].turn_id
        await stack.turn_events(turn_id, 3)
    assert stack.scheduler.batches[-1] == 3
    assert stack.scheduler.events_of(turn_id) == ["started", "first_token", "finished"]


async def test_a_lazy_event_is_sent_alone_after_the_flush_delay(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link, "LAZY_FLUSH_SECONDS", 0.05)
    async with asyncio.timeout(10):
        await stack.dp.link.wait_ready()
        stack.dp.link.report(wire.started("t-lazy", "run-lazy"))
        await asyncio.sleep(0.01)
        assert stack.scheduler.events_of("t-lazy") == []
        await stack.turn_events("t-lazy", 1)
    assert stack.scheduler.batches[-1] == 1


async def test_resync_carries_turns_in_flight(stack: Stack) -> None:
    release = asyncio.Event()

    async def slow(request: object) -> object:
        await release.wait()
        return await stack.engine.stream(request)  # type: ignore[arg-type]

    stack.engine.handler = slow  # type: ignore[assignment]
    async with asyncio.timeout(10):
        pending = asyncio.create_task(
            stack.post(
                stack.chat(), **{"x-luftpause-run-id": "run-busy", "x-luftpause-caller": "c1"}
            )
        )
        await stack.engine.changes.until(lambda: len(stack.engine.seen) == 1)
        stack.scheduler.break_sessions()
        resyncs = len(stack.scheduler.resyncs)
        await stack.scheduler.changes.until(lambda: len(stack.scheduler.resyncs) > resyncs)
        release.set()
        status, _, _ = await pending
    resync = stack.scheduler.resyncs[-1]
    [turn] = resync.turns
    assert (turn.run_id, turn.replica_id, turn.model, turn.caller) == (
        "run-busy",
        "engine-a",
        "sim-model",
        "c1",
    )
    assert turn.turn_id == stack.scheduler.admits[-1].turn_id
    assert {r.run_id: r.phase for r in resync.runs} == {"run-busy": pb.RUN_PHASE_GENERATING}
    assert status == 200


async def test_admission_lost_with_its_stream_is_sent_again_under_the_same_turn_id_after_a_resync(
    stack: Stack,
) -> None:
    stack.scheduler.fail_admits = 2
    mark = len(stack.scheduler.calls)
    async with asyncio.timeout(10):
        status, _, _ = await stack.post(stack.chat())
    admits = stack.scheduler.admits
    assert status == 200
    assert len(admits) == 3 and len({a.turn_id for a in admits}) == 1
    calls = kinds_after(stack.scheduler.calls, mark)
    assert calls == [
        "admit",
        "session-broken",
        "resync",
        "session",
        "admit",
        "session-broken",
        "resync",
        "session",
        "admit",
    ]


async def test_turn_is_held_while_the_scheduler_is_down_and_admitted_once_it_is_back(
    stack: Stack,
) -> None:
    async with asyncio.timeout(15):
        await stack.post(stack.chat(), **{"x-luftpause-run-id": "run-old"})
        await stack.stop_scheduler()
        held = asyncio.create_task(stack.post(stack.chat(), **{"x-luftpause-run-id": "run-new"}))
        done, _ = await asyncio.wait({held}, timeout=0.3)
        assert not done, "a turn must wait for the scheduler, not fail"
        mark = len(stack.scheduler.calls)
        await stack.start_scheduler()
        status, headers, _ = await held
    assert status == 200 and headers["x-luftpause-run-id"] == "run-new"
    calls = kinds_after(stack.scheduler.calls, mark)
    assert calls.index("resync") < calls.index("admit")
    assert "run-old" in {r.run_id for r in stack.scheduler.resyncs[-1].runs}


async def test_deleting_a_run_reports_its_end_and_forgets_it(stack: Stack) -> None:
    async with asyncio.timeout(10):
        await stack.post(stack.chat(), **{"x-luftpause-run-id": "run-done"})
        async with stack.http.delete(stack.url + "/v1/runs/run-done") as resp:
            body = await resp.json()
        await stack.scheduler.changes.until(
            lambda: any(e.WhichOneof("kind") == "run_ended" for e in stack.scheduler.events)
        )
    assert resp.status == 200 and body == {"id": "run-done", "deleted": True}
    ended = [e for e in stack.scheduler.events if e.WhichOneof("kind") == "run_ended"]
    assert [e.run_id for e in ended] == ["run-done"]
    assert stack.dp.runs.phase("run-done") is None
