"""The scheduler as a real process: gRPC Admit/Report/Resync/Status, health, reflection, HTTP.

Engines are tiny aiohttp servers in the test whose health and reported load we control.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from luftpause.rpc import scheduler_pb2 as pb
from luftpause.rpc import scheduler_pb2_grpc as pb_grpc
from luftpause.testkit.procs import Proc, free_port

MODEL = "sim"


@dataclass
class StubEngine:
    """An engine whose /health and /metrics answers the test sets."""

    healthy: bool = True
    running: int = 0
    waiting: int = 0
    kv_total: int = 0  # exported as SGLang's pool when set
    port: int = field(default_factory=free_port)

    def app(self) -> web.Application:
        async def health(_: web.Request) -> web.Response:
            return web.json_response({}, status=200 if self.healthy else 503)

        async def metrics(_: web.Request) -> web.Response:
            pool = f"sglang:max_total_num_tokens {self.kv_total}\n" if self.kv_total else ""
            return web.Response(
                text=f"sglang:num_running_reqs {self.running}\n"
                f"sglang:num_queue_reqs {self.waiting}\n{pool}"
            )

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        return app


@dataclass
class Stack:
    engines: dict[str, StubEngine]
    channel: grpc.aio.Channel
    stub: pb_grpc.SchedulerStub
    http: str

    async def status(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as s, s.get(self.http + "/status") as resp:
            return await resp.json()

    async def until(
        self, predicate: Callable[[dict[str, Any]], object], timeout: float = 10.0
    ) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                st = await self.status()
                if predicate(st):
                    return st
                await asyncio.sleep(0.05)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    engines = {"a": StubEngine(), "b": StubEngine()}
    runners = []
    for eng in engines.values():
        runner = web.AppRunner(eng.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", eng.port).start()
        runners.append(runner)
    config = tmp_path / "endpoints.yaml"
    config.write_text(
        "endpoints:\n"
        + "".join(
            f"  - id: {rid}\n    url: http://127.0.0.1:{e.port}\n    models: [{MODEL}]\n"
            for rid, e in engines.items()
        )
    )
    grpc_port, http_port = free_port(), free_port()
    proc = await Proc(
        [
            "scheduler",
            "--config",
            str(config),
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
            "--probe-period",
            "0.2",
        ],
        log_path=tmp_path / "scheduler.log",
    ).start()
    try:
        await proc.wait_http(f"http://127.0.0.1:{http_port}/health")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
        st = Stack(
            engines, channel, pb_grpc.SchedulerStub(channel), f"http://127.0.0.1:{http_port}"
        )
        await st.until(lambda s: all(r["healthy"] for r in s["replicas"]))
        yield st
        await channel.close()
    finally:
        assert await proc.stop() == 0
        for runner in runners:
            await runner.cleanup()


def admit(turn: str, run: str, model: str = MODEL, caller: str = "") -> pb.AdmitRequest:
    return pb.AdmitRequest(
        turn_id=turn,
        run_id=run,
        model=model,
        caller=caller,
        service_class=pb.SERVICE_CLASS_INTERACTIVE,
        dataplane_id="dp",
    )


async def test_admit_places_the_turn_on_a_healthy_replica(stack: Stack) -> None:
    async with asyncio.timeout(5):
        reply = await stack.stub.Admit(admit("t1", "r1"))
    assert reply.replica_id in {"a", "b"}
    assert reply.replica_url == f"http://127.0.0.1:{stack.engines[reply.replica_id].port}"


async def test_unknown_model_is_not_found_at_once(stack: Stack) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with asyncio.timeout(5):
            await stack.stub.Admit(admit("t1", "r1", model="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "no Generative replica serves model 'nope'"


async def test_cancelled_admit_removes_the_held_turn(stack: Stack) -> None:
    for eng in stack.engines.values():
        eng.healthy = False
    await stack.until(lambda s: not any(r["healthy"] for r in s["replicas"]))
    call = stack.stub.Admit(admit("t1", "r1"))
    await stack.until(lambda s: s["held_total"] == 1)
    call.cancel()
    await stack.until(lambda s: s["held_total"] == 0)
    for eng in stack.engines.values():
        eng.healthy = True
    st = await stack.until(lambda s: all(r["healthy"] for r in s["replicas"]))
    assert st["turns_in_flight"] == 0


async def test_capped_replica_holds_turns_until_a_reported_finish_frees_a_slot(
    stack: Stack,
) -> None:
    stack.engines["b"].healthy = False
    stack.engines["a"].running, stack.engines["a"].waiting = 1, 2
    await stack.until(lambda s: s["replicas"][0]["capped"] and not s["replicas"][1]["healthy"])
    async with asyncio.timeout(5):
        first = await stack.stub.Admit(admit("t1", "r1"))
    assert first.replica_id == "a"
    second = asyncio.ensure_future(stack.stub.Admit(admit("t2", "r2")))
    await stack.until(lambda s: s["held_total"] == 1)
    started = pb.TurnEvent(turn_id="t1", run_id="r1", started=pb.TurnStarted())
    finished = pb.TurnEvent(
        turn_id="t1",
        run_id="r1",
        finished=pb.TurnFinished(finish_reason="tool_calls", tool_calls=True),
    )
    session = stack.stub.Report()
    await session.write(
        pb.DataplaneBatch(items=[pb.DataplaneItem(event=started), pb.DataplaneItem(event=finished)])
    )
    async with asyncio.timeout(5):
        placed = await second
    assert placed.replica_id == "a" and placed.held_ms > 0
    st = await stack.status()
    assert st["runs"]["tool_paused"]["interactive"] == 1
    await session.done_writing()
    async with asyncio.timeout(5):
        assert [b.placements async for b in session if b.placements] == []


async def test_resync_rebuilds_runs_and_turns_in_flight(stack: Stack) -> None:
    req = pb.ResyncRequest(dataplane_id="dp")
    req.runs.add(
        run_id="r1",
        replica_id="b",
        phase=pb.RUN_PHASE_TOOL_PAUSED,
        service_class=pb.SERVICE_CLASS_INTERACTIVE,
        caller="c",
    )
    req.runs.add(
        run_id="r2",
        replica_id="a",
        phase=pb.RUN_PHASE_GENERATING,
        service_class=pb.SERVICE_CLASS_BATCH,
        caller="c",
    )
    req.turns.add(
        turn_id="t2",
        run_id="r2",
        replica_id="a",
        model=MODEL,
        service_class=pb.SERVICE_CLASS_BATCH,
        caller="c",
    )
    async with asyncio.timeout(5):
        reply = await stack.stub.Resync(req)
        assert (reply.runs, reply.turns) == (2, 1)
        status = await stack.stub.Status(pb.StatusRequest())
        again = await stack.stub.Admit(admit("t3", "r1"))
    assert again.replica_id == "b"  # the paused run kept its replica
    assert {r.id: r.in_flight for r in status.replicas} == {"a": 1, "b": 0}
    # Stub engines export no KV pool: unknown, nothing held for it.
    assert {(r.kv_tokens, r.kv_used, r.new_batch_fits) for r in status.replicas} == {(0, -1, True)}


async def test_status_carries_an_engines_kv_pool_and_the_working_set(stack: Stack) -> None:
    stack.engines["a"].kv_total = 40_000
    await stack.until(lambda s: s["replicas"][0]["kv"]["tokens"] == 40_000)
    async with asyncio.timeout(5):
        status = await stack.stub.Status(pb.StatusRequest())
    a = next(r for r in status.replicas if r.id == "a")
    assert (a.kv_tokens, a.resident_tokens, a.resident_runs) == (40_000, 0, 0)
    assert a.new_batch_fits and a.new_interactive_fits


async def test_grpc_health_and_reflection_answer(stack: Stack) -> None:
    async with asyncio.timeout(5):
        health = await health_pb2_grpc.HealthStub(stack.channel).Check(
            health_pb2.HealthCheckRequest(service="luftpause.v1.Scheduler")
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(stack.channel)
        call = refl.ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        answer = await call.read()
        await call.done_writing()
    names = {s.name for s in answer.list_services_response.service}
    assert "luftpause.v1.Scheduler" in names


async def test_list_models_and_http_pages_answer(stack: Stack) -> None:
    async with asyncio.timeout(5):
        models = await stack.stub.ListModels(pb.ListModelsRequest())
        async with aiohttp.ClientSession() as s:
            async with s.get(stack.http + "/") as page:
                html = await page.text()
            async with s.get(stack.http + "/metrics") as metrics:
                text = await metrics.text()
    assert [(m.id, sorted(m.replica_ids)) for m in models.models] == [(MODEL, ["a", "b"])]
    assert "luftpause scheduler" in html and "setInterval(poll, 2000)" in html
    assert 'luftpause_replica_healthy{replica="a"} 1.0' in text


async def test_watch_status_sends_the_status_then_each_change_and_nothing_in_between(
    stack: Stack,
) -> None:
    call = stack.stub.WatchStatus(pb.WatchStatusRequest(min_interval_ms=100))
    try:
        async with asyncio.timeout(10):
            first = await call.read()
            assert {r.id: r.healthy for r in first.replicas} == {"a": True, "b": True}
            quiet = asyncio.ensure_future(call.read())
            done, _ = await asyncio.wait({quiet}, timeout=1.0)  # probes every 0.2 s, no change
            assert not done, "a status was sent though nothing changed"
            stack.engines["b"].healthy = False
            changed = await quiet
            assert {r.id: r.healthy for r in changed.replicas} == {"a": True, "b": False}
    finally:
        call.cancel()
