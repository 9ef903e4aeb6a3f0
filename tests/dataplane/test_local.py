"""Local placement on open replicas: the rule (pure), and the dataplane applying it against a
fake scheduler that announces open replicas: no wait, the placement reported in order before
the turn's events, everything else still asked, nothing local while the scheduler is away."""

from __future__ import annotations

import asyncio
import json
from functools import partial

import pytest

from luftpause.common.prefixes import opening_keys
from luftpause.dataplane import wire
from luftpause.dataplane.identity import ServiceClass
from luftpause.dataplane.link import SchedulerLink
from luftpause.dataplane.local import OpeningMemory, OpenReplica, by_model, choose_open
from luftpause.dataplane.runs import Phase, RunRecord, RunTable
from luftpause.rpc import scheduler_pb2 as pb
from tests.dataplane.conftest import Stack, running_stack
from tests.dataplane.fakes import MODEL


def replica(rid: str, *models: str) -> OpenReplica:
    return OpenReplica(replica_id=rid, url=f"http://{rid}:1", models=frozenset(models or ("m",)))


def run_on(rid: str, phase: Phase = Phase.IDLE) -> RunRecord:
    return RunRecord(
        run_id="r",
        replica_id=rid,
        phase=phase,
        service_class=ServiceClass.INTERACTIVE,
        caller="",
        since=0.0,
        in_flight=1 if phase is Phase.GENERATING else 0,
    )


A, B = replica("a"), replica("b")


def test_a_fresh_run_with_nothing_to_tell_goes_to_the_least_loaded_then_by_id() -> None:
    assert choose_open((A, B), run=None, fresh=True, load={}) is A
    assert choose_open((A, B), run=None, fresh=True, load={"a": 2, "b": 1}) is B
    assert choose_open((A, B), run=None, fresh=True, load={"a": 1, "b": 1}) is A


@pytest.mark.parametrize("phase", list(Phase))
def test_a_known_run_goes_to_its_replica_only_while_it_is_open(phase: Phase) -> None:
    assert choose_open((A, B), run=run_on("b", phase), fresh=False, load={"b": 9}) is B
    assert choose_open((A,), run=run_on("b", phase), fresh=False, load={}) is None


def test_an_unknown_run_a_client_named_and_a_model_with_no_open_replica_are_asked() -> None:
    assert choose_open((A, B), run=None, fresh=False, load={}) is None
    assert choose_open((), run=None, fresh=True, load={}) is None


def test_a_fresh_run_goes_where_it_costs_least_to_read_its_opening_and_the_queue() -> None:
    memory = OpeningMemory()
    opening = opening_keys(
        [{"role": "system", "content": "shared " * 100}, {"role": "user", "content": "x"}]
    )
    memory.record("b", opening[:1])  # the shared system prompt (700 bytes) went to b
    choose = partial(
        choose_open, (A, B), run=None, fresh=True, opening=opening, memory=memory, load={}
    )
    assert choose(request_bytes=1000) is B  # 300 bytes to read there, 1000 on a
    assert choose(request_bytes=1000, pending={"b": 800}) is A  # b has 1100 to read first
    assert choose(request_bytes=1000, pending={"b": 600}) is B
    assert choose(request_bytes=1000, opening=()) is A  # alike: fewer in flight, then by id


def test_the_opening_memory_forgets_the_least_recently_used_keys() -> None:
    memory = OpeningMemory(size=2)
    memory.record("a", [(1, 10), (2, 20)])
    memory.record("a", [(1, 10), (3, 30)])  # 1 used again, 2 is the oldest
    assert memory.matched("a", [(1, 10)]) == 10 and memory.matched("a", [(2, 20)]) == 0
    assert memory.matched("a", [(1, 10), (3, 30)]) == 30 and memory.matched("b", [(1, 10)]) == 0


async def test_a_run_the_dataplane_has_not_served_is_admitted_with_its_opening(
    stack: Stack,
) -> None:
    async with asyncio.timeout(10):
        await stack.post(stack.chat(), **{"x-luftpause-run-id": "new"})
        await stack.post(stack.chat(), **{"x-luftpause-run-id": "new"})
        await stack.scheduler.changes.until(lambda: len(stack.scheduler.admits) == 2)
    first, second = stack.scheduler.admits
    body = stack.chat()
    expected = opening_keys(body["messages"], body.get("tools"))
    assert [(k.hash, k.bytes) for k in first.opening] == list(expected)
    assert first.prompt_bytes >= len(json.dumps(body, separators=(",", ":")))
    assert list(second.opening) == []  # its run is known here now: no keys


def test_open_replicas_are_indexed_by_model_in_id_order() -> None:
    index = by_model([replica("b", "x", "y"), replica("a", "x")])
    assert [r.replica_id for r in index["x"]] == ["a", "b"]
    assert [r.replica_id for r in index["y"]] == ["b"]


async def test_the_end_of_a_turn_waits_briefly_only_on_an_open_replica() -> None:
    link = SchedulerLink(target="127.0.0.1:1", dataplane_id="d", runs=RunTable())
    link._set_open([A])
    failed = wire.failed("t1", "r1", "engine gone")
    link.report(failed, "a")
    assert [i.event for i in link._lazy] == [failed] and link._queue.empty()
    link.report(failed, "b")
    link.report(wire.run_ended("r1"))
    assert link._queue.qsize() == 2
    link._set_open([])
    link.report(failed, "a")
    assert link._queue.qsize() == 3


def open_engine(stack: Stack, **priorities: int) -> None:
    stack.scheduler.set_open(
        pb.OpenReplica(
            replica_id="engine-a", replica_url=stack.engine_url, models=[MODEL], **priorities
        )
    )


async def until_open(stack: Stack, want: bool = True) -> None:
    while bool(stack.dp.link.open_for(MODEL)) != want:
        await asyncio.sleep(0.01)


async def test_a_fresh_run_on_an_open_replica_is_sent_at_once_and_reported(stack: Stack) -> None:
    stack.scheduler.hold = True  # an asked-for turn would wait for `release`
    open_engine(stack)
    async with asyncio.timeout(10):
        await until_open(stack)
        status, headers, _ = await stack.post(stack.chat())
        assert status == 200  # no placement came: it was never asked for
        await stack.scheduler.changes.until(lambda: bool(stack.scheduler.admits))
        admit = stack.scheduler.admits[-1]
        events = await stack.turn_events(admit.turn_id, 3)
    assert admit.placed_replica_id == "engine-a"
    assert admit.run_id == headers["x-luftpause-run-id"]
    assert events == ["started", "first_token", "finished"]
    assert [a.turn_id for a in stack.scheduler.admits] == [admit.turn_id]  # reported once
    assert stack.dp.metrics.placed_locally._value.get() == 1
    assert stack.dp.runs.runs[admit.run_id].replica_id == "engine-a"
    assert stack.dp.runs.load == {}


async def test_own_runs_are_placed_locally_and_a_client_named_unknown_run_is_asked(
    stack: Stack,
) -> None:
    async with asyncio.timeout(10):
        await stack.post(stack.chat(), **{"x-luftpause-run-id": "mine"})  # asked: nothing open
        open_engine(stack)
        await until_open(stack)
        await stack.post(stack.chat(), **{"x-luftpause-run-id": "mine"})
        await stack.post(stack.chat(), **{"x-luftpause-run-id": "someone-elses"})
        await stack.scheduler.changes.until(lambda: len(stack.scheduler.admits) == 3)
    asked = {a.run_id: a.placed_replica_id for a in stack.scheduler.admits}
    assert [a.placed_replica_id for a in stack.scheduler.admits] == ["", "engine-a", ""]
    assert asked["someone-elses"] == ""


async def test_a_run_another_dataplane_took_is_forgotten_and_asked_for_again(
    stack: Stack,
) -> None:
    open_engine(stack)
    async with asyncio.timeout(10):
        await until_open(stack)
        _, headers, _ = await stack.post(stack.chat())
        run_id = headers["x-luftpause-run-id"]
        assert run_id in stack.dp.runs.runs
        stack.scheduler.take(run_id)
        while run_id in stack.dp.runs.runs:
            await asyncio.sleep(0.01)
        await stack.post(stack.chat(), **{"x-luftpause-run-id": run_id})
        await stack.scheduler.changes.until(lambda: len(stack.scheduler.admits) == 2)
    assert [a.placed_replica_id for a in stack.scheduler.admits] == ["engine-a", ""]
    assert not [e for e in stack.scheduler.events if e.HasField("run_ended")]


async def test_the_open_replica_priority_goes_to_the_engine(stack: Stack) -> None:
    open_engine(stack, interactive_priority=0, batch_priority=100)
    async with asyncio.timeout(10):
        await until_open(stack)
        await stack.post(stack.chat(priority=7), **{"x-luftpause-class": "batch"})
    assert json.loads(stack.engine.seen[-1].body)["priority"] == 100


async def test_a_closed_replica_and_a_broken_session_send_every_turn_to_the_scheduler(
    stack: Stack,
) -> None:
    open_engine(stack)
    async with asyncio.timeout(10):
        await until_open(stack)
        stack.scheduler.set_open()  # capped now: nothing open
        await until_open(stack, want=False)
        await stack.post(stack.chat())
        assert stack.scheduler.admits[-1].placed_replica_id == ""
        open_engine(stack)
        await until_open(stack)
        # The scheduler goes away: the list is forgotten at once, and a turn waits for it.
        stack.scheduler.open = None
        await stack.stop_scheduler()
        await until_open(stack, want=False)
        post = asyncio.create_task(stack.post(stack.chat()))
        await asyncio.sleep(0.3)
        assert not post.done() and not stack.dp.runs.turns
        await stack.start_scheduler()
        status, _, _ = await post
    assert status == 200
    assert stack.scheduler.admits[-1].placed_replica_id == ""


async def test_without_local_placement_every_turn_is_asked() -> None:
    async with running_stack(local_placement=False) as stack, asyncio.timeout(10):
        open_engine(stack)
        await until_open(stack)  # the list arrives; it is not used
        await stack.post(stack.chat())
        assert stack.scheduler.admits[-1].placed_replica_id == ""
