"""`GET /v1/models` never fails because the scheduler is not up yet."""

from __future__ import annotations

import asyncio

from tests.dataplane.conftest import Stack, lone_dataplane, running_stack

FILE_MODELS = ("gemma-3-270m", "llama-3.2-1b")


def openai_list(*ids: str) -> dict[str, object]:
    return {
        "object": "list",
        "data": [{"id": m, "object": "model", "created": 0, "owned_by": "luftpause"} for m in ids],
    }


async def test_models_come_from_the_scheduler_in_openai_list_shape(stack: Stack) -> None:
    async with asyncio.timeout(10), stack.http.get(stack.url + "/v1/models") as resp:
        body = await resp.json()
    assert resp.status == 200 and body == openai_list("sim-model")


async def test_a_reachable_scheduler_answers_even_when_the_dataplane_has_an_endpoint_file() -> None:
    async with running_stack() as stack, asyncio.timeout(10):
        stack.dp.config_models = FILE_MODELS
        stack.scheduler.models = ["from-the-scheduler"]
        async with stack.http.get(stack.url + "/v1/models") as resp:
            body = await resp.json()
    assert resp.status == 200 and body == openai_list("from-the-scheduler")


async def test_before_its_scheduler_is_up_the_endpoint_file_answers() -> None:
    async with lone_dataplane(config_models=FILE_MODELS) as lone, asyncio.timeout(10):
        status, body = await lone.get("/v1/models")
    assert status == 200 and body == openai_list(*FILE_MODELS)


async def test_the_endpoint_file_answers_while_the_scheduler_is_down(stack: Stack) -> None:
    stack.dp.config_models = FILE_MODELS
    await stack.stop_scheduler()
    async with asyncio.timeout(10), stack.http.get(stack.url + "/v1/models") as resp:
        body = await resp.json()
    assert resp.status == 200 and body == openai_list(*FILE_MODELS)


async def test_without_a_file_the_request_waits_for_the_scheduler_and_gets_its_list() -> None:
    async with lone_dataplane() as lone, asyncio.timeout(10):
        held = asyncio.create_task(lone.get("/v1/models"))
        # Not answered while the scheduler cannot be reached: the request is held.
        done, _ = await asyncio.wait({held}, timeout=0.3)
        assert not done
        await lone.start_scheduler()
        status, body = await held
    assert status == 200 and body == openai_list("sim-model")


async def test_without_a_file_the_hold_is_bounded_then_a_json_503_says_unreachable() -> None:
    async with lone_dataplane(models_hold_seconds=0.3) as lone, asyncio.timeout(10):
        status, body = await lone.get("/v1/models")
    assert status == 503
    assert body["error"]["message"].startswith("scheduler unreachable: UNAVAILABLE")
