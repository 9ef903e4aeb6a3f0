"""The gRPC surface in-process: single-pass admission, and Report streams: placements down,
held turns withdrawn or dropped with their stream, the dataplane each names."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from luftpause.common.config import Endpoint, EndpointKind
from luftpause.rpc import scheduler_pb2 as pb
from luftpause.rpc import scheduler_pb2_grpc as pb_grpc
from luftpause.scheduler.core.events import ProbeResult
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.rpc import DATAPLANE_METADATA, SchedulerService

ENDPOINTS = [
    Endpoint(id="gen", url="http://gen:1", models=frozenset({"llm"})),
    Endpoint(
        id="cls", url="http://cls:1", models=frozenset({"roberta"}), kind=EndpointKind.SINGLE_PASS
    ),
]


@pytest.fixture
async def served() -> AsyncIterator[tuple[SchedulerHost, pb_grpc.SchedulerStub]]:
    host = SchedulerHost(ENDPOINTS)
    for rid in ("gen", "cls"):
        host.apply(ProbeResult(at=host.now(), replica_id=rid, healthy=True, running=0, waiting=0))
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServicer_to_server(SchedulerService(host), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield host, pb_grpc.SchedulerStub(channel)
    await channel.close()
    await server.stop(grace=None)


async def test_single_pass_turn_goes_to_a_single_pass_replica_without_a_run(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    host, stub = served
    async with asyncio.timeout(5):
        reply = await stub.Admit(
            pb.AdmitRequest(turn_id="c1", model="roberta", single_pass=True, dataplane_id="dp")
        )
    assert reply.replica_id == "cls"
    assert not host.state.runs and not host.state.caller_in_flight


async def test_single_pass_model_is_not_served_by_generative_replicas(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    _, stub = served
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with asyncio.timeout(5):
            await stub.Admit(pb.AdmitRequest(turn_id="c1", model="llm", single_pass=True))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "no Single-pass replica serves model 'llm'"


def admit_item(turn: str, model: str = "llm", run: str = "r") -> pb.DataplaneItem:
    return pb.DataplaneItem(
        admit=pb.AdmitRequest(turn_id=turn, run_id=run, model=model, dataplane_id="dp-7")
    )


def event_item(**kwargs: object) -> pb.DataplaneItem:
    return pb.DataplaneItem(event=pb.TurnEvent(**kwargs))  # type: ignore[arg-type]


def session(stub: pb_grpc.SchedulerStub) -> Any:
    """A Report stream of dataplane dp-7."""
    return stub.Report(metadata=((DATAPLANE_METADATA, "dp-7"),))


async def send(call: Any, *items: pb.DataplaneItem) -> None:
    await call.write(pb.DataplaneBatch(items=items))


async def until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


async def ended(call: Any) -> None:
    """Close the writing side; the scheduler ends the stream with no more placements."""
    await call.done_writing()
    assert [batch.placements async for batch in call if batch.placements] == []


async def placements(call: Any, count: int) -> dict[str, pb.Placement]:
    got: dict[str, pb.Placement] = {}
    while len(got) < count:
        batch = await call.read()
        got.update({p.turn_id: p for p in batch.placements})
    return got


async def test_session_marks_its_dataplane_connected_then_gone(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    host, stub = served
    call = session(stub)
    async with asyncio.timeout(5):
        await send(call, event_item(turn_id="x", run_id="r", started=pb.TurnStarted()))
        await until(lambda: "dp-7" in host.state.dataplanes)
        assert host.state.dataplanes["dp-7"].streams == 1
        await ended(call)
    link = host.state.dataplanes["dp-7"]
    assert link.streams == 0 and link.gone_since is not None


async def test_session_places_refuses_and_rejects_admissions_sent_in_one_message(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    _, stub = served
    call = session(stub)
    bad = pb.DataplaneItem(admit=pb.AdmitRequest(turn_id="t3", model="llm"))
    async with asyncio.timeout(5):
        await send(call, admit_item("t1"), admit_item("t2", model="nope"), bad)
        got = await placements(call, 3)
        await call.done_writing()
    assert got["t1"].placed.replica_id == "gen" and got["t1"].placed.replica_url == "http://gen:1"
    assert got["t2"].refused.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert got["t2"].refused.message == "no Generative replica serves model 'nope'"
    assert got["t3"].refused.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


async def test_held_admission_is_withdrawn_by_its_abandoned_event(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    host, stub = served
    host.apply(ProbeResult(at=host.now(), replica_id="gen", healthy=False))
    call = session(stub)
    async with asyncio.timeout(5):
        await send(call, admit_item("t1"))
        await until(lambda: "t1" in host.state.held)
        await send(call, event_item(turn_id="t1", abandoned=pb.TurnAbandoned()))
        await until(lambda: "t1" not in host.state.held)
        await ended(call)


async def test_held_admissions_are_dropped_when_their_session_ends(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    host, stub = served
    host.apply(ProbeResult(at=host.now(), replica_id="gen", healthy=False))
    call = session(stub)
    async with asyncio.timeout(5):
        await send(call, admit_item("t1"), admit_item("t2", run="r2"))
        await until(lambda: len(host.state.held) == 2)
        call.cancel()
        await until(lambda: not host.state.held)
    host.apply(ProbeResult(at=host.now(), replica_id="gen", healthy=True))
    assert not host.state.turns


async def test_an_admission_sent_again_on_a_new_session_is_placed_there(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    host, stub = served
    host.apply(ProbeResult(at=host.now(), replica_id="gen", healthy=False))
    old = session(stub)
    new = session(stub)
    async with asyncio.timeout(5):
        await send(old, admit_item("t1"))
        await send(new, admit_item("t1"))

        def streams() -> int:
            link = host.state.dataplanes.get("dp-7")
            return 0 if link is None else link.streams

        await until(lambda: streams() == 2)
        old.cancel()  # the old stream's end must not withdraw the turn the new one waits for
        await until(lambda: streams() == 1)
        assert "t1" in host.state.held
        host.apply(ProbeResult(at=host.now(), replica_id="gen", healthy=True))
        got = await placements(new, 1)
        await new.done_writing()
    assert got["t1"].placed.replica_id == "gen"


def open_ids(batch: pb.PlacementBatch) -> list[str]:
    return [r.replica_id for r in batch.open.replicas]


async def test_session_opens_with_the_open_replicas_and_follows_their_changes(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    host, stub = served
    call = session(stub)
    async with asyncio.timeout(5):
        first = await call.read()
        assert first.HasField("open") and open_ids(first) == ["gen"]  # single-pass never open
        assert list(first.open.replicas[0].models) == ["llm"]
        assert first.open.replicas[0].replica_url == "http://gen:1"
        assert not first.open.replicas[0].HasField("interactive_priority")
        host.apply(ProbeResult(at=host.now(), replica_id="gen", healthy=True, running=2, waiting=3))
        closed = await call.read()
        assert closed.HasField("open") and open_ids(closed) == []
        host.apply(ProbeResult(at=host.now(), replica_id="gen", healthy=True, running=0, waiting=0))
        assert open_ids(await call.read()) == ["gen"]
        await call.done_writing()


async def test_turn_placed_by_the_dataplane_is_recorded_and_not_answered(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    host, stub = served
    call = session(stub)
    local = pb.DataplaneItem(
        admit=pb.AdmitRequest(
            turn_id="t1", run_id="r", model="llm", dataplane_id="dp-7", placed_replica_id="gen"
        )
    )
    async with asyncio.timeout(5):
        await call.read()  # the open replicas
        await send(call, local, admit_item("t2", run="r2"))
        got = await placements(call, 1)
        assert list(got) == ["t2"]  # the asked-for one only
        turn = host.state.turns["t1"]
        assert (turn.replica, turn.dataplane, host.state.runs["r"].replica) == (
            "gen",
            "dp-7",
            "gen",
        )
        assert host.state.replicas["gen"].in_flight == 2
        assert host.metrics.placed_by_dataplane._value.get() == 1
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF


async def test_a_run_taken_by_another_dataplane_is_named_to_the_one_that_had_it(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    _, stub = served
    first = session(stub)
    second = stub.Report(metadata=((DATAPLANE_METADATA, "dp-8"),))

    async def next_taken(call: Any) -> list[str]:
        while True:
            batch = await call.read()
            if batch.taken_runs:
                return list(batch.taken_runs)

    async with asyncio.timeout(5):
        await send(first, admit_item("t1", run="r"))
        await placements(first, 1)
        await send(first, event_item(turn_id="t1", run_id="r", finished=pb.TurnFinished()))
        other = pb.AdmitRequest(turn_id="t2", run_id="r", model="llm", dataplane_id="dp-8")
        await send(second, pb.DataplaneItem(admit=other))
        assert await next_taken(first) == ["r"]
        await first.done_writing()
        await second.done_writing()
