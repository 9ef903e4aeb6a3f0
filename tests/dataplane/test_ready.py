"""The dataplane's readiness (`GET /ready`: it has reached its scheduler) apart from its
liveness (`GET /health`: the process serves)."""

from __future__ import annotations

import asyncio

from tests.dataplane.conftest import Lone, Stack, lone_dataplane

TOKEN = b"s3cret-token"


async def until_status(lone: Lone | Stack, path: str, status: int) -> dict[str, object]:
    """Poll `path` until it answers `status` (the caller bounds the wait); its body."""
    while True:
        async with lone.http.get(lone.url + path) as resp:
            if resp.status == status:
                body: dict[str, object] = await resp.json()
                return body
        await asyncio.sleep(0.02)


async def test_a_dataplane_before_its_scheduler_is_alive_not_ready_then_ready() -> None:
    async with lone_dataplane() as lone, asyncio.timeout(10):
        assert await lone.get("/health") == (200, {"status": "ok"})
        status, body = await lone.get("/ready")
        assert status == 503
        message = body["error"]["message"]
        assert message.startswith(f"scheduler unreachable at 127.0.0.1:{lone.grpc_port}")
        await lone.start_scheduler()
        assert await until_status(lone, "/ready", 200) == {
            "status": "ready",
            "scheduler": "connected",
        }
        assert lone.dp.link.ready


async def test_a_dataplane_stays_ready_holding_turns_while_its_scheduler_is_away(
    stack: Stack,
) -> None:
    async with asyncio.timeout(10):
        await until_status(stack, "/ready", 200)
        await stack.stop_scheduler()
        while stack.dp.link.ready:
            await asyncio.sleep(0.02)
        body = await until_status(stack, "/ready", 200)
        async with stack.http.get(stack.url + "/health") as resp:
            assert resp.status == 200
    assert body["status"] == "ready"
    assert "scheduler unreachable" in str(body["scheduler"])
    assert str(body["scheduler"]).endswith("turns are held")


async def test_ready_and_health_need_no_bearer_when_auth_is_on() -> None:
    async with lone_dataplane(token=TOKEN) as lone, asyncio.timeout(10):
        assert (await lone.get("/health"))[0] == 200
        assert (await lone.get("/ready"))[0] == 503
        assert (await lone.get("/v1/models"))[0] == 401
        await lone.start_scheduler()
        await until_status(lone, "/ready", 200)
