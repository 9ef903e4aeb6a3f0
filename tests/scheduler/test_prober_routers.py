"""Routers as backends: a replica's load summed from the engines behind it (`load_from`).

The first tests are pure (no sockets, no event loop); the rest run the real `Prober` against
small HTTP servers on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from luftpause.common.config import Endpoint, parse_config
from luftpause.scheduler.core.model import Replica
from luftpause.scheduler.engine_load import Load, engine_max_running, sum_loads
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.prober import LoadTarget, Prober, engine_slots, load_targets

PERIOD = 0.2


def sglang(running: int, waiting: int) -> str:
    return f"sglang:num_running_reqs {running}\nsglang:num_queue_reqs {waiting}\n"


def endpoints(*raw: dict[str, Any]) -> tuple[Endpoint, ...]:
    return parse_config({"endpoints": list(raw)}).endpoints


# --- pure -----------------------------------------------------------------------------------


def test_loads_of_all_targets_are_summed() -> None:
    loads = [Load(running=3, waiting=1), Load(running=4, waiting=0), Load(running=1, waiting=5)]
    assert sum_loads(loads) == Load(running=8, waiting=6)


def test_targets_without_a_load_are_left_out_of_the_sum() -> None:
    assert sum_loads([None, Load(running=2, waiting=1), None]) == Load(running=2, waiting=1)


def test_no_target_with_a_load_means_no_load() -> None:
    assert sum_loads([None, None]) is None
    assert sum_loads([]) is None


def test_kv_pools_are_summed_only_when_every_target_reports_one() -> None:
    both = [Load(running=1, waiting=0, kv_total=100, kv_used=10)] * 2
    assert sum_loads(both) == Load(running=2, waiting=0, kv_total=200, kv_used=20)
    one = [both[0], Load(running=1, waiting=0)]
    assert sum_loads(one) == Load(running=2, waiting=0)


def test_plain_replica_reads_its_own_metrics_path_with_its_own_key() -> None:
    (e,) = endpoints(
        {"id": "a", "url": "http://a:1/", "models": ["m"], "metrics": "/m", "api_key_env": "K"}
    )
    assert load_targets(e, {"a": e}) == (
        LoadTarget(url="http://a:1/m", api_key_env="K", base="http://a:1"),
    )


def test_replica_without_a_metrics_path_has_no_load_targets() -> None:
    (e,) = endpoints({"id": "hosted", "url": "https://h", "models": ["m"], "metrics": ""})
    assert load_targets(e, {"hosted": e}) == ()


def test_router_reads_urls_at_metrics_and_ids_at_their_own_metrics_path_and_key() -> None:
    eps = endpoints(
        {
            "id": "gpu-0",
            "url": "https://gpu-0:8000",
            "models": ["m"],
            "metrics": "/prom",
            "api_key_env": "GPU_KEY",
        },
        {
            "id": "router",
            "url": "http://router:30000",
            "models": ["m"],
            "metrics": "/router-metrics",
            "api_key_env": "ROUTER_KEY",
            "load_from": ["gpu-0", "http://gpu-1:30001/", "http://gpu-2:30001/sub"],
        },
    )
    by_id = {e.id: e for e in eps}
    assert load_targets(by_id["router"], by_id) == (
        LoadTarget(url="https://gpu-0:8000/prom", api_key_env="GPU_KEY", base="https://gpu-0:8000"),
        LoadTarget(url="http://gpu-1:30001/metrics", base="http://gpu-1:30001"),
        LoadTarget(url="http://gpu-2:30001/sub/metrics", base="http://gpu-2:30001/sub"),
    )


# --- against loopback HTTP servers ---------------------------------------------------------


@dataclass
class FakeServer:
    """A loopback server with a health path and a metrics path whose answers tests change."""

    metrics: str = ""
    metrics_path: str = "/metrics"
    health_status: int = 200
    metrics_status: int = 200
    metrics_delay: float = 0.0
    require_key: str | None = None
    # Anthropic's way: the key in x-api-key, and no answer without anthropic-version.
    anthropic: bool = False
    url: str = ""
    health_hits: int = 0
    metrics_hits: int = 0

    def _authorised(self, request: web.Request) -> bool:
        key = self.require_key
        if self.anthropic:
            return (
                request.headers.get("x-api-key") == key and "anthropic-version" in request.headers
            )
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"

    async def health(self, request: web.Request) -> web.Response:
        self.health_hits += 1
        if not self._authorised(request):
            return web.Response(status=401)
        return web.Response(status=self.health_status)

    async def prometheus(self, request: web.Request) -> web.Response:
        self.metrics_hits += 1
        if not self._authorised(request):
            return web.Response(status=401)
        if self.metrics_delay:
            await asyncio.sleep(self.metrics_delay)
        return web.Response(text=self.metrics, status=self.metrics_status)


@contextlib.asynccontextmanager
async def running(
    *servers: FakeServer, routes: dict[str, Callable[[web.Request], Any]] | None = None
) -> AsyncIterator[None]:
    runners = []
    try:
        for server in servers:
            app = web.Application()
            app.router.add_get("/health", server.health)
            app.router.add_get(server.metrics_path, server.prometheus)
            for path, handler in (routes or {}).items():
                app.router.add_get(path, handler)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        yield
    finally:
        for runner in runners:
            await runner.cleanup()


@contextlib.asynccontextmanager
async def probing(eps: tuple[Endpoint, ...]) -> AsyncIterator[SchedulerHost]:
    host = SchedulerHost(eps)
    task = asyncio.create_task(Prober(host, eps, period=PERIOD).run())
    try:
        yield host
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(host: SchedulerHost, rid: str, check: Callable[[Replica], bool]) -> Replica:
    """Poll the host's state (bounded) until replica `rid` satisfies `check`."""
    async with asyncio.timeout(10):
        while not check(replica := host.state.replicas[rid]):
            await asyncio.sleep(PERIOD / 4)
    return replica


async def probed(count: Callable[[], int], rounds: int = 3) -> None:
    """Wait (bounded) until a server has seen `rounds` more probes: earlier rounds are applied."""
    target = count() + rounds
    async with asyncio.timeout(10):
        while count() < target:
            await asyncio.sleep(PERIOD / 4)


def router(url: str, *load_from: str, **extra: Any) -> dict[str, Any]:
    return {"id": "router", "url": url, "models": ["m"], "load_from": list(load_from), **extra}


def load_is(running: int | None, waiting: int | None) -> Callable[[Replica], bool]:
    return lambda r: r.healthy and (r.engine_running, r.engine_waiting) == (running, waiting)


async def test_router_load_is_the_sum_of_the_engines_behind_it_not_its_own_metrics() -> None:
    front = FakeServer(metrics=sglang(100, 100))
    gpu0, gpu1 = FakeServer(metrics=sglang(3, 2)), FakeServer(metrics=sglang(4, 1))
    async with running(front, gpu0, gpu1):
        eps = endpoints(router(front.url, gpu0.url, gpu1.url))
        async with probing(eps) as host:
            replica = await until(host, "router", load_is(7, 3))
            assert replica.capacity == 7
            gpu0.metrics, gpu1.metrics = sglang(1, 0), sglang(2, 0)
            replica = await until(host, "router", load_is(3, 0))
            assert replica.capacity == 7  # no queue, but the cap holds until the pool idles
            gpu0.metrics, gpu1.metrics = sglang(0, 0), sglang(0, 0)
            replica = await until(host, "router", load_is(0, 0))
            assert replica.capacity is None


async def test_failing_and_silent_targets_are_left_out_of_the_sum() -> None:
    front = FakeServer()
    good = FakeServer(metrics=sglang(2, 5))
    broken = FakeServer(metrics=sglang(50, 50), metrics_status=500)
    silent = FakeServer(metrics="process_cpu_seconds_total 3\n")
    refused = "http://127.0.0.1:1"
    async with running(front, good, broken, silent):
        eps = endpoints(router(front.url, good.url, broken.url, silent.url, refused))
        async with probing(eps) as host:
            await until(host, "router", load_is(2, 5))


async def test_target_slower_than_the_period_is_left_out_and_the_probe_still_reports() -> None:
    front = FakeServer()
    quick = FakeServer(metrics=sglang(1, 1))
    slow = FakeServer(metrics=sglang(40, 40), metrics_delay=30.0)
    async with running(front, quick, slow):
        eps = endpoints(router(front.url, quick.url, slow.url))
        async with probing(eps) as host:
            await until(host, "router", load_is(1, 1))


async def test_router_whose_targets_give_no_load_is_healthy_and_uncapped_by_load() -> None:
    front = FakeServer(metrics=sglang(9, 9))
    silent = FakeServer(metrics="# nothing here\n")
    async with running(front, silent):
        eps = endpoints(router(front.url, silent.url, "http://127.0.0.1:1"))
        async with probing(eps) as host:
            await until(host, "router", lambda r: r.healthy)
            await probed(lambda: silent.metrics_hits)
            replica = host.state.replicas["router"]
            assert replica.healthy and replica.engine_running is None
            # No load read: like a hosted API it takes one turn until its first reply.
            assert replica.cap is None and replica.unread and replica.capacity == 1


async def test_router_health_comes_from_its_own_health_path() -> None:
    front = FakeServer(health_status=503)
    gpu0 = FakeServer(metrics=sglang(3, 3))
    async with running(front, gpu0):
        eps = endpoints(router(front.url, gpu0.url))
        async with probing(eps) as host:
            await probed(lambda: front.health_hits)
            replica = host.state.replicas["router"]
            assert not replica.healthy and replica.engine_waiting is None
            front.health_status = 200
            await until(host, "router", load_is(3, 3))


async def test_load_from_an_endpoint_id_uses_its_metrics_path_and_its_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPU_KEY", "gpu-secret")
    front = FakeServer()
    gpu0 = FakeServer(metrics=sglang(2, 1), metrics_path="/prom", require_key="gpu-secret")
    gpu1 = FakeServer(metrics=sglang(5, 4))
    async with running(front, gpu0, gpu1):
        eps = endpoints(
            {
                "id": "gpu-0",
                "url": gpu0.url,
                "models": ["m"],
                "metrics": "/prom",
                "api_key_env": "GPU_KEY",
            },
            router(front.url, "gpu-0", gpu1.url),
        )
        async with probing(eps) as host:
            await until(host, "gpu-0", load_is(2, 1))
            await until(host, "router", load_is(7, 5))


async def test_probes_carry_the_key_and_fail_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    hosted = FakeServer(require_key="secret")
    async with running(hosted):
        eps = endpoints(
            {"id": "hosted", "url": hosted.url, "models": ["m"], "api_key_env": "HOSTED_KEY"}
        )
        monkeypatch.delenv("HOSTED_KEY", raising=False)
        async with probing(eps) as host:
            await probed(lambda: hosted.health_hits)
            assert not host.state.replicas["hosted"].healthy
            monkeypatch.setenv("HOSTED_KEY", "secret")
            await until(host, "hosted", lambda r: r.healthy)


async def test_an_anthropic_endpoints_probe_sends_its_key_as_anthropic_wants_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hosted = FakeServer(require_key="secret", anthropic=True)
    async with running(hosted):
        eps = endpoints(
            {
                "id": "anthropic",
                "url": hosted.url,
                "models": ["m"],
                "api_key_env": "ANTHROPIC_KEY",
                "key_header": "x-api-key",
                "apis": ["messages"],
            }
        )
        monkeypatch.setenv("ANTHROPIC_KEY", "secret")
        async with probing(eps) as host:
            await until(host, "anthropic", lambda r: r.healthy)


# --- engine slots (llama.cpp /props) ---------------------------------------------------------


def test_the_engines_slot_count_is_read_from_total_slots() -> None:
    assert engine_slots({"total_slots": 4, "model_path": "x"}) == 4
    bad: object
    for bad in ({}, {"total_slots": "4"}, {"total_slots": 0}, {"total_slots": True}, [], None):
        assert engine_slots(bad) is None


async def test_a_slot_count_unlike_the_engines_is_warned_about_once_per_health() -> None:
    engine = FakeServer(metrics="llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n")
    props_hits = 0

    async def props(request: web.Request) -> web.Response:
        nonlocal props_hits
        props_hits += 1
        return web.json_response({"total_slots": 2})

    async with running(engine, routes={"/props": props}):
        eps = endpoints({"id": "llama", "url": engine.url, "models": ["m"], "slots": 4})
        with capture_logs() as logs:
            async with probing(eps):
                await probed(lambda: engine.health_hits, rounds=4)
                engine.health_status = 503
                await probed(lambda: engine.health_hits, rounds=2)
                engine.health_status = 200
                await probed(lambda: engine.health_hits, rounds=3)
    warned = [e for e in logs if e["event"] == "engine slots differ from the endpoint file"]
    assert props_hits == 2 and len(warned) == 2  # once, and again after it came back
    assert (warned[0]["configured"], warned[0]["engine"]) == (4, 2)


# --- the most requests a batching engine runs (SGLang /server_info) --------------------------


def test_the_most_requests_an_engine_runs_is_read_from_server_info() -> None:
    assert engine_max_running({"max_running_requests": 48, "max_total_num_tokens": 9}) == 48
    nested = {"max_running_requests": None, "internal_states": [{"max_running_requests": 7}]}
    assert engine_max_running(nested) == 7
    effective = {"internal_states": [{"effective_max_running_requests_per_dp": 64}]}
    assert engine_max_running(effective) == 64
    bad: object
    for bad in ({}, {"max_running_requests": "48"}, {"internal_states": []}, [], None):
        assert engine_max_running(bad) is None


KV_ENGINE = sglang(2, 1) + "sglang:max_total_num_tokens 50000\nsglang:num_used_tokens 1000\n"


async def test_a_batching_engine_is_capped_at_the_most_its_server_info_says_it_runs() -> None:
    engine = FakeServer(metrics=KV_ENGINE.replace("num_running_reqs 2", "num_running_reqs 6"))

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({"max_running_requests": 6, "max_total_num_tokens": 50000})

    async with running(engine, routes={"/server_info": server_info}):
        eps = endpoints({"id": "sglang", "url": engine.url, "models": ["m"]})
        async with probing(eps) as host:
            replica = await until(host, "sglang", lambda r: r.cap == 6)
    assert (replica.kv_tokens, replica.kv_used, replica.max_running) == (50000, 1000, 6)
    assert replica.engine_running == 6


async def test_a_batching_engine_that_does_not_say_its_limit_is_never_capped_by_its_queue() -> None:
    engine = FakeServer(metrics=KV_ENGINE)
    async with running(engine):  # no /server_info: 404
        eps = endpoints({"id": "vllm", "url": engine.url, "models": ["m"]})
        async with probing(eps) as host:
            await probed(lambda: engine.metrics_hits, rounds=4)
            replica = host.state.replicas["vllm"]
    assert replica.engine_waiting == 1 and replica.kv_tokens == 50000
    assert replica.cap is None and replica.max_running is None


async def test_the_endpoint_files_max_running_is_used_without_asking() -> None:
    engine = FakeServer(metrics=KV_ENGINE)
    asked = 0

    async def server_info(request: web.Request) -> web.Response:
        nonlocal asked
        asked += 1
        return web.json_response({"max_running_requests": 6})

    async with running(engine, routes={"/server_info": server_info}):
        eps = endpoints({"id": "e", "url": engine.url, "models": ["m"], "max_running": 2})
        async with probing(eps) as host:
            replica = await until(host, "e", lambda r: r.healthy and r.kv_tokens is not None)
            await probed(lambda: engine.metrics_hits, rounds=2)
    assert replica.cap == 2 and asked == 0  # it runs 2, its most: capped there
