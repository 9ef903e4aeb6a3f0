"""The gRPC surface in-process: single-pass admission and Report streams naming their dataplane."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

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
        host.apply(ProbeResult(at=host.now(), replica_id=rid, healthy=True))
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


async def test_report_stream_marks_its_dataplane_connected_then_gone(
    served: tuple[SchedulerHost, pb_grpc.SchedulerStub],
) -> None:
    host, stub = served
    call = stub.Report(metadata=((DATAPLANE_METADATA, "dp-7"),))
    async with asyncio.timeout(5):
        await call.write(pb.TurnEvent(turn_id="x", run_id="r", started=pb.TurnStarted()))
        while "dp-7" not in host.state.dataplanes:
            await asyncio.sleep(0.01)
        assert host.state.dataplanes["dp-7"].streams == 1
        await call.done_writing()
        await call
    link = host.state.dataplanes["dp-7"]
    assert link.streams == 0 and link.gone_since is not None
