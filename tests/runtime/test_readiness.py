"""The runtime's readiness check of its dataplane: asked with a short timeout, kept ~1 s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from luftpause.runtime.server.readiness import DataplaneReadiness, Verdict, fresh


@dataclass
class FakeDataplane:
    """A dataplane whose /ready the test sets; counts the requests it gets."""

    ready: bool = False
    stall: bool = False
    asked: int = 0
    url: str = ""
    _release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, _: web.Request) -> web.Response:
        self.asked += 1
        if self.stall:
            await self._release.wait()
        if self.ready:
            return web.json_response({"status": "ready"})
        message = "scheduler unreachable at sched:5000: no session opened yet"
        return web.json_response({"error": {"message": message}}, status=503)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def dataplane() -> AsyncIterator[FakeDataplane]:
    fake = FakeDataplane()
    app = web.Application()
    app.router.add_get("/ready", fake.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield fake
    fake._release.set()
    await runner.cleanup()


def test_a_verdict_is_fresh_for_its_time_to_live_only() -> None:
    verdict = Verdict(ready=True, message="ready", at=10.0)
    assert fresh(verdict, 10.0, 1.0) and fresh(verdict, 10.99, 1.0)
    assert not fresh(verdict, 11.0, 1.0) and not fresh(None, 10.0, 1.0)
    assert not fresh(verdict, 9.0, 1.0)  # a clock that went back proves nothing


async def test_not_ready_says_why_then_ready_once_the_dataplane_is(
    dataplane: FakeDataplane,
) -> None:
    clock = Clock()
    check = DataplaneReadiness(dataplane.url, clock=clock)
    try:
        async with asyncio.timeout(10):
            first = await check.check()
            assert not first.ready
            assert first.message == (
                f"dataplane not ready at {dataplane.url}/ready: "
                "scheduler unreachable at sched:5000: no session opened yet"
            )
            dataplane.ready = True
            clock.now += 1.0
            assert (await check.check()).ready
    finally:
        await check.close()


async def test_checks_within_a_second_ask_the_dataplane_once(dataplane: FakeDataplane) -> None:
    clock = Clock()
    check = DataplaneReadiness(dataplane.url, clock=clock, ttl=1.0)
    try:
        async with asyncio.timeout(10):
            verdicts = await asyncio.gather(*(check.check() for _ in range(5)))
            clock.now += 0.5
            verdicts.append(await check.check())
            assert dataplane.asked == 1 and not any(v.ready for v in verdicts)
            clock.now += 0.5
            await check.check()
            assert dataplane.asked == 2
    finally:
        await check.close()


async def test_a_dataplane_that_does_not_answer_in_time_is_not_ready(
    dataplane: FakeDataplane,
) -> None:
    dataplane.stall = True
    check = DataplaneReadiness(dataplane.url, timeout=0.1)
    try:
        async with asyncio.timeout(10):
            verdict = await check.check()
    finally:
        await check.close()
    assert not verdict.ready and verdict.message.startswith("dataplane not ready at")


async def test_a_dataplane_that_is_not_there_is_not_ready() -> None:
    check = DataplaneReadiness("http://127.0.0.1:9")
    try:
        async with asyncio.timeout(10):
            verdict = await check.check()
    finally:
        await check.close()
    assert not verdict.ready and "127.0.0.1:9/ready" in verdict.message
