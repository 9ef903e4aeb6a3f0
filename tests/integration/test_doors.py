"""The Messages and Responses doors end to end, with the official `anthropic` and `openai`
clients: client -> dataplane -> scheduler -> simulated engines, every process real.

The stack's dataplane translates both APIs to Chat Completions (its endpoint file says the
engines serve `chat` only); a second dataplane of the same scheduler reads an endpoint file
saying they serve all three, and passes each turn through unchanged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import anthropic
import pytest
import pytest_asyncio
import yaml
from anthropic import AsyncAnthropic
from anthropic.types import Message, MessageParam, ToolParam
from openai import AsyncOpenAI
from openai.types.responses import FunctionToolParam

from luftpause.testkit.stack import SIM_MODEL, Dataplane, LocalStack
from luftpause.testkit.status import fetch_status

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOOKUP: ToolParam = {
    "name": "lookup",
    "description": "Look something up.",
    "input_schema": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
}
# The SDK's type makes `strict` required; the API does not, and this tool leaves it out as
# many agents' tools do.
FUNCTION = cast(
    FunctionToolParam, {"type": "function", "name": "lookup", "parameters": LOOKUP["input_schema"]}
)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def native(stack: LocalStack) -> AsyncIterator[Dataplane]:
    """A dataplane whose endpoint file says the engines serve all three APIs."""
    config = yaml.safe_load((stack.workdir / "endpoints.yaml").read_text())
    for endpoint in config["endpoints"]:
        endpoint["apis"] = ["chat", "messages", "responses"]
    path = stack.workdir / "endpoints-native.yaml"
    path.write_text(yaml.safe_dump(config))
    yield await stack.launcher.dataplane(stack.scheduler, name="dataplane-native", config=path)


BETA = {"anthropic-beta": "context-management-2025-06-27"}


def claude(url: str) -> AsyncAnthropic:
    return AsyncAnthropic(
        base_url=url, api_key="any", max_retries=0, timeout=30, default_headers=BETA
    )


def codex(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="any", max_retries=0, timeout=30)


async def engine_requests(stack: LocalStack) -> list[dict[str, Any]]:
    """What the engines received, both of them, oldest first."""
    seen: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        for i in range(2):
            async with http.get(stack.engine_url(i) + "/debug/requests") as resp:
                seen += (await resp.json())["requests"]
    return sorted(seen, key=lambda r: r["time"])


async def claude_run(client: AsyncAnthropic, task: str, *, stream: bool) -> list[str]:
    """A tool-using run to its final answer, the way an agent loop drives it; the run id of
    each turn, as the dataplane's reply header says."""
    messages: list[Any] = [{"role": "user", "content": task}]
    run_ids = []
    message: Message
    for _ in range(6):
        if stream:
            async with client.messages.stream(
                model=SIM_MODEL, max_tokens=300, messages=messages, tools=[LOOKUP]
            ) as events:
                run_ids.append(events.response.headers["x-luftpause-run-id"])
                message = await events.get_final_message()
        else:
            raw_reply = await client.messages.with_raw_response.create(
                model=SIM_MODEL, max_tokens=300, messages=messages, tools=[LOOKUP]
            )
            run_ids.append(raw_reply.headers["x-luftpause-run-id"])
            message = await raw_reply.parse()
        if message.stop_reason != "tool_use":
            assert message.content[0].type == "text" and message.content[0].text
            return run_ids
        messages.append({"role": "assistant", "content": message.content})
        results = [
            {"type": "tool_result", "tool_use_id": block.id, "content": "1,012 km"}
            for block in message.content
            if block.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    raise AssertionError("the run never ended")


@pytest.mark.parametrize("stream", [True, False])
async def test_an_anthropic_client_runs_a_tool_loop_as_one_run(
    stack: LocalStack, stream: bool
) -> None:
    async with asyncio.timeout(60):
        client = claude(stack.base_url.removesuffix("/v1"))
        run_ids = await claude_run(client, "How long is the Loire?", stream=stream)
        await client.close()
        requests = await engine_requests(stack)
    # Two tool rounds (the stack's engines), then the answer: three turns, one run.
    assert len(run_ids) == 3 and len(set(run_ids)) == 1
    assert all(r["path"] == "/v1/chat/completions" for r in requests[-3:])


async def test_an_anthropic_client_through_an_engine_serving_the_messages_api(
    stack: LocalStack, native: Dataplane
) -> None:
    async with asyncio.timeout(60):
        client = claude(native.url)
        run_ids = await claude_run(client, "How long is the Rhine?", stream=True)
        counted = await client.messages.count_tokens(
            model=SIM_MODEL, messages=[{"role": "user", "content": "How long is the Rhine?"}]
        )
        await client.close()
        requests = await engine_requests(stack)
    assert len(set(run_ids)) == 1 and len(run_ids) == 3
    turns = [r for r in requests if r["path"] == "/v1/messages"][-3:]
    assert len(turns) == 3 and len({r["headers"]["Host"] for r in turns}) == 1  # one replica
    assert all(r["headers"]["anthropic-version"] for r in turns)
    assert all(r["headers"]["anthropic-beta"] == BETA["anthropic-beta"] for r in turns)
    assert all("x-api-key" not in {k.lower() for k in r["headers"]} for r in turns)
    assert counted.input_tokens > 0


@pytest.mark.parametrize("door", ["translated", "native"])
async def test_the_openai_responses_api_streamed_and_not(
    stack: LocalStack, native: Dataplane, door: str
) -> None:
    url = stack.base_url.removesuffix("/v1") if door == "translated" else native.url
    async with asyncio.timeout(60), codex(url) as client:
        async with client.responses.stream(
            model=SIM_MODEL, input="How long is the Loire?", tools=[FUNCTION]
        ) as stream:
            first = await stream.get_final_response()
        call = first.output[0]
        assert call.type == "function_call"
        followed = await client.responses.with_raw_response.create(
            model=SIM_MODEL,
            tools=[FUNCTION],
            store=False,
            input=[
                {"role": "user", "content": "How long is the Loire?"},
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": "1,012 km"},
            ],
        )
        second = followed.parse()
    assert second.status == "completed" and second.output
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    requests = await engine_requests(stack)
    path = "/v1/chat/completions" if door == "translated" else "/v1/responses"
    assert [r["path"] for r in requests[-2:]] == [path, path]
    assert followed.headers["x-luftpause-run-id"]


async def test_failures_reach_the_anthropic_client_as_its_own_errors(stack: LocalStack) -> None:
    async with asyncio.timeout(30):
        client = claude(stack.base_url.removesuffix("/v1"))
        with pytest.raises(anthropic.NotFoundError) as missing:
            await client.messages.create(
                model="no-such-model", max_tokens=10, messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(
                model=SIM_MODEL,
                max_tokens=10,
                # Bad input on purpose: a role the API does not have.
                messages=[cast(MessageParam, {"role": "robot", "content": "x"})],
            )
        await client.close()
    assert missing.value.body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "no Generative replica serves model 'no-such-model'",
        },
    }
    assert isinstance(bad.value.body, dict) and "messages.0" in json.dumps(bad.value.body)
    st = await fetch_status(stack.status_url)
    assert st["turns_in_flight"] == 0
