"""The scheduler's `admit` spans: child of the turn's traceparent, ended at placement with the
replica and the time held, and why the turn was held."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from luftpause.common.config import Endpoint
from luftpause.rpc import scheduler_pb2 as pb
from luftpause.rpc import scheduler_pb2_grpc as pb_grpc
from luftpause.scheduler import spans
from luftpause.scheduler.core.events import Admit, ProbeResult, TurnFinished
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.rpc import DATAPLANE_METADATA, SchedulerService

TRACE = 0x0AF7651916CD43DD8448EB211C80319C
PARENT = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE:032x}-{PARENT:016x}-01"
ENDPOINTS = [
    Endpoint(id="gen", url="http://gen:1", models=frozenset({"llm"})),
    Endpoint(id="gen2", url="http://gen2:1", models=frozenset({"llm"})),
]


def healthy(host: SchedulerHost, *ids: str, running: int | None = None) -> None:
    waiting = None if running is None else 1  # a queue: capped at what it runs
    for rid in ids:
        host.apply(
            ProbeResult(
                at=host.now(), replica_id=rid, healthy=True, running=running, waiting=waiting
            )
        )


@pytest.fixture
async def served(
    exported: InMemorySpanExporter,
) -> AsyncIterator[tuple[SchedulerHost, pb_grpc.SchedulerStub]]:
    host = SchedulerHost(ENDPOINTS[:1])
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServicer_to_server(SchedulerService(host), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield host, pb_grpc.SchedulerStub(channel)
    await channel.close()
    await server.stop(grace=None)


def admit(turn: str, **fields: object) -> pb.AdmitRequest:
    return pb.AdmitRequest(turn_id=turn, run_id="r", model="llm", dataplane_id="dp", **fields)  # type: ignore[arg-type]


def attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


async def finished(exported: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    while len(exported.get_finished_spans()) < count:
        await asyncio.sleep(0.01)
    return list(exported.get_finished_spans())


async def test_a_unary_admit_is_a_span_under_the_traceparent_in_its_metadata(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub], exported: InMemorySpanExporter
) -> None:
    host, stub = served
    healthy(host, "gen")
    async with asyncio.timeout(5):
        await stub.Admit(admit("t1"), metadata=(("traceparent", TRACEPARENT),))
        [span] = await finished(exported, 1)
    assert span.name == "admit" and span.kind is SpanKind.SERVER
    assert span.context is not None and span.context.trace_id == TRACE
    assert span.parent is not None and span.parent.span_id == PARENT
    got = attributes(span)
    assert got["luftpause.replica"] == "gen" and got["luftpause.placed_by"] == "scheduler"
    assert got["luftpause.held_ms"] == pytest.approx(0.0, abs=50.0)
    assert got["luftpause.turn_id"] == "t1" and got["gen_ai.request.model"] == "llm"
    assert "luftpause.held_reason" not in got  # placed at once


async def test_a_held_session_admission_says_why_and_ends_when_placed(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub], exported: InMemorySpanExporter
) -> None:
    host, stub = served
    call = stub.Report(metadata=((DATAPLANE_METADATA, "dp"),))
    async with asyncio.timeout(5):
        await call.write(
            pb.DataplaneBatch(items=[pb.DataplaneItem(admit=admit("t1", traceparent=TRACEPARENT))])
        )
        while "t1" not in host.state.held:
            await asyncio.sleep(0.01)
        healthy(host, "gen")
        [span] = await finished(exported, 1)
        await call.done_writing()
    got = attributes(span)
    assert got["luftpause.held_reason"] == "unhealthy"
    held_ms = got["luftpause.held_ms"]
    assert got["luftpause.replica"] == "gen" and isinstance(held_ms, float) and held_ms > 0
    assert span.parent is not None and span.parent.span_id == PARENT


async def test_admissions_dropped_with_their_session_end_their_spans_abandoned(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub], exported: InMemorySpanExporter
) -> None:
    host, stub = served
    call = stub.Report(metadata=((DATAPLANE_METADATA, "dp"),))
    async with asyncio.timeout(5):
        await call.write(pb.DataplaneBatch(items=[pb.DataplaneItem(admit=admit("t1"))]))
        while "t1" not in host.state.held:
            await asyncio.sleep(0.01)
        call.cancel()
        [span] = await finished(exported, 1)
    assert attributes(span)["error.type"] == "abandoned"


async def test_a_turn_the_dataplane_placed_itself_is_a_span_that_ends_at_once(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub], exported: InMemorySpanExporter
) -> None:
    host, stub = served
    healthy(host, "gen")
    call = stub.Report(metadata=((DATAPLANE_METADATA, "dp"),))
    local = admit("t1", placed_replica_id="gen", traceparent=TRACEPARENT)
    async with asyncio.timeout(5):
        await call.write(pb.DataplaneBatch(items=[pb.DataplaneItem(admit=local)]))
        [span] = await finished(exported, 1)
        await call.done_writing()
    got = attributes(span)
    assert got["luftpause.placed_by"] == "dataplane" and got["luftpause.replica"] == "gen"
    assert got["luftpause.held_ms"] == 0.0
    assert span.parent is not None and span.parent.span_id == PARENT


def test_held_turns_are_held_for_their_replica_or_for_room() -> None:
    host = SchedulerHost(ENDPOINTS)
    healthy(host, "gen", "gen2", running=1)  # both capped at one turn

    def place(turn: str, run: str) -> None:
        host.apply(Admit(at=host.now(), turn_id=turn, run_id=run, model="llm"))

    place("t1", "r1")
    home = host.state.turns["t1"].replica
    host.apply(TurnFinished(at=host.now(), turn_id="t1", tool_calls=True))  # r1 paused there
    place("t2", "r2")
    place("t3", "r3")
    assert {host.state.turns["t2"].replica, host.state.turns["t3"].replica} == {"gen", "gen2"}
    place("t4", "r1")  # its replica is full; the other one too
    place("t5", "r5")
    assert spans.held_reason(host.state, "t4") == "affinity"
    assert host.state.held["t4"].bucket[1] == home
    assert spans.held_reason(host.state, "t5") == "capacity"
    assert spans.held_reason(host.state, "t2") is None  # placed, not held
