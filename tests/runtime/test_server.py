"""`server.app`: the runtime's MCP tools and HTTP routes, driven by the official `mcp` client over
its in-memory connection (and httpx over ASGI for the routes), in front of a real `Runtime`
whose model is the engine simulator and whose tools are the fake MCP server, on 127.0.0.1.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent

from luftpause.runtime.core import machine as m
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.server.app import build_server, caller_of, spec_from
from luftpause.runtime.server.arguments import SpawnArgs
from luftpause.runtime.server.readiness import Verdict
from tests.runtime.loopback import MODEL, FakeMcp, runtime_on

GOLDEN_TOOLS = Path(__file__).with_name("golden") / "tools_list.json"
WAIT = 10.0


def connect(runtime: Runtime) -> Client:
    """The official client on the server's in-memory connection (entered inside each test:
    its task scope must open and close in the same task)."""
    return Client(build_server(runtime, default_model=MODEL))


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def ok(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, text(result)
    assert result.structured_content is not None
    return result.structured_content


async def refused(client: Client, tool: str, args: dict[str, Any]) -> str:
    """The message of a call the server refuses; never a stack trace."""
    result = await client.call_tool(tool, args)
    assert result.is_error, result
    message = text(result)
    assert "Traceback" not in message and 'File "' not in message
    return message


# --- the tool interface ---


async def test_the_tools_clients_see_are_exactly_the_published_ones(runtime: Runtime) -> None:
    """The golden file is the public interface: names, order, descriptions, schemas, defaults.
    A difference here is a change every MCP client sees."""
    async with connect(runtime) as client:
        listed = (await client.list_tools()).tools
        dumped = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed]
        assert json.dumps(dumped, indent=2) + "\n" == GOLDEN_TOOLS.read_text()


async def test_run_takes_spawns_parameters_word_for_word_plus_a_timeout(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        tools = {t.name: t.input_schema for t in (await client.list_tools()).tools}
        spawn, run = tools["spawn"]["properties"], dict(tools["run"]["properties"])
        assert run.pop("timeout")["default"] == 60.0
        assert run == spawn and list(run) == list(spawn)
        assert tools["spawn"]["required"] == tools["run"]["required"] == ["task"]


# --- spawn and run ---


async def test_spawn_puts_every_argument_into_the_runs_spec(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        parent = (await ok(client, "spawn", {"task": "parent", "tools": ["deep_search"]}))["handle"]
        args = {
            "task": "child",
            "model": "other-model",
            "serviceClass": "batch",
            "system": "be brief",
            "maxToolCalls": 3,
            "tools": ["lookup"],
            "maxTokens": 99,
            "parallelToolCalls": True,
            "parent": parent,
            "budgetTokens": 1000,
            "budgetToolCalls": 5,
            "budgetSeconds": 30.5,
            "approveTools": ["lookup"],
        }
        handle = (await ok(client, "spawn", args))["handle"]
        spec = runtime.runs[handle].state.spec
        assert (spec.task, spec.model, spec.service_class, spec.system) == (
            "child",
            "other-model",
            "batch",
            "be brief",
        )
        assert (spec.max_tool_calls, spec.tools, spec.max_tokens) == (3, ("lookup",), 99)
        assert spec.parallel_tool_calls and spec.parent == parent
        assert (spec.budget_tokens, spec.budget_tool_calls, spec.budget_seconds) == (1000, 5, 30.5)
        assert spec.approve_tools == ("lookup",)
        assert spec.caller.startswith("mcp:")  # no session header in memory: the client's name


async def test_spawn_without_options_takes_the_runtimes_defaults(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        handle = (await ok(client, "spawn", {"task": "t"}))["handle"]
        spec = runtime.runs[handle].state.spec
        assert (spec.model, spec.service_class, spec.system, spec.tools) == (
            MODEL,
            "interactive",
            None,
            None,
        )
        assert (spec.max_tool_calls, spec.max_tokens) == (
            m.DEFAULT_MAX_TOOL_CALLS,
            m.DEFAULT_MAX_TOKENS,
        )
        assert not spec.parallel_tool_calls and spec.approve_tools == () and spec.parent is None
        assert (spec.budget_tokens, spec.budget_tool_calls, spec.budget_seconds) == (
            None,
            None,
            None,
        )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({}, "task"),
        ({"task": "t", "maxToolCalls": -1}, "maxToolCalls"),
        ({"task": "t", "serviceClass": "urgent"}, "serviceClass"),
        ({"task": "t", "budgetSeconds": "soon"}, "budgetSeconds"),
        ({"task": "t", "tools": "lookup"}, "tools"),
    ],
)
async def test_arguments_outside_the_schema_are_refused_naming_the_argument(
    runtime: Runtime, args: dict[str, Any], named: str
) -> None:
    async with connect(runtime) as client:
        for tool in ("spawn", "run"):
            message = await refused(client, tool, args)
            assert named in message, message
        assert runtime.runs == {}


async def test_an_empty_task_is_refused_as_bad_arguments(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        message = await refused(client, "spawn", {"task": ""})
        assert "bad arguments: handle, task and model must not be empty" in message
        assert runtime.runs == {}


async def test_spawn_under_an_unknown_parent_tells_the_client_which(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        message = await refused(client, "spawn", {"task": "t", "parent": "run-nope"})
        assert "unknown parent run run-nope" in message


async def test_run_spawns_a_run_and_answers_with_its_result(
    runtime: Runtime, tools: FakeMcp
) -> None:
    async with connect(runtime) as client:
        out = await ok(client, "run", {"task": "find otters", "tools": ["lookup"], "timeout": WAIT})
        assert out["state"] == "finished" and out["result"] and out["toolCalls"] == 1
        assert list(runtime.runs) == [out["handle"]] and tools.stats.calls["lookup"] == 1


async def test_run_answers_at_its_timeout_with_the_run_still_going(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        out = await ok(client, "run", {"task": "t", "tools": ["deep_search"], "timeout": 0.1})
        assert out["state"] in ("running", "tools")


# --- await, status, cancel, approve ---


async def test_await_answers_each_run_in_the_order_asked(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        quick = (await ok(client, "spawn", {"task": "t", "tools": ["lookup"]}))["handle"]
        out = await ok(client, "await", {"handles": [quick, "run-nope"], "timeout": WAIT})
        assert [(r["handle"], r["state"]) for r in out["runs"]] == [
            (quick, "finished"),
            ("run-nope", "unknown"),
        ]


async def test_status_lists_every_run_or_just_the_ones_asked_for(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        first = (await ok(client, "spawn", {"task": "a", "tools": ["deep_search"]}))["handle"]
        second = (await ok(client, "spawn", {"task": "b", "tools": ["deep_search"]}))["handle"]
        every = await ok(client, "status", {})
        assert [r["handle"] for r in every["runs"]] == [first, second]
        one = await ok(client, "status", {"handles": [second]})
        assert [r["handle"] for r in one["runs"]] == [second]


async def test_cancel_answers_with_the_runs_it_cancelled(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        handle = (await ok(client, "spawn", {"task": "t", "tools": ["deep_search"]}))["handle"]
        assert await ok(client, "cancel", {"handle": handle}) == {"cancelled": [handle]}
        [run] = (await ok(client, "status", {"handles": [handle]}))["runs"]
        assert (run["state"], run["error"]) == ("cancelled", "cancelled")


async def test_cancel_and_approve_of_an_unknown_run_say_there_is_no_such_run(
    runtime: Runtime,
) -> None:
    async with connect(runtime) as client:
        assert "no run run-nope" in await refused(client, "cancel", {"handle": "run-nope"})
        message = await refused(client, "approve", {"handle": "run-nope", "allow": True})
        assert "no run run-nope" in message


async def test_approve_lets_a_waiting_tool_call_run(runtime: Runtime, tools: FakeMcp) -> None:
    async with connect(runtime) as client:
        handle = (await ok(client, "spawn", {"task": "t", "tools": ["delete_record"]}))["handle"]
        out = await ok(client, "await", {"handles": [handle], "timeout": 0.5})
        assert out["runs"][0]["state"] == "AwaitingApproval"
        answer = await ok(client, "approve", {"handle": handle, "allow": True})
        assert answer == {"handle": handle, "tool": "delete_record", "allow": True}
        done = await ok(client, "await", {"handles": [handle], "timeout": WAIT})
        assert done["runs"][0]["state"] == "finished" and tools.stats.calls["delete_record"] == 1
        message = await refused(client, "approve", {"handle": handle, "allow": True})
        assert f"run {handle} is not waiting for an approval" in message


async def test_tools_lists_the_upstream_catalogue(runtime: Runtime, tools: FakeMcp) -> None:
    async with connect(runtime) as client:
        listed = (await ok(client, "tools", {}))["tools"]
        assert {t["name"] for t in listed} >= {"lookup", "deep_search", "delete_record"}
        assert {t["server"] for t in listed} == {tools.url}


# --- decide ---


@dataclass
class DecidePlane:
    """A dataplane's POST /v1/decide that records what it was asked; input "fail" gets a 400."""

    url: str = ""
    asked: list[tuple[dict[str, Any], str]] = field(default_factory=list)

    async def decide(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.asked.append((body, request.headers.get("x-luftpause-caller", "")))
        if body["input"] == "fail":
            return web.json_response({"error": {"message": "no such model"}}, status=400)
        return web.json_response({"label": "urgent", "probabilities": {"urgent": 0.9}})


@pytest.fixture
async def plane() -> AsyncIterator[DecidePlane]:
    fake = DecidePlane()
    app = web.Application()
    app.router.add_post("/v1/decide", fake.decide)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield fake
    await runner.cleanup()


@pytest.fixture
async def deciding(tmp_path: Path, plane: DecidePlane) -> AsyncIterator[Runtime]:
    async with runtime_on(tmp_path, plane.url, []) as rt:
        yield rt


async def test_decide_asks_the_dataplane_with_the_model_the_labels_call_for(
    deciding: Runtime, plane: DecidePlane
) -> None:
    server = build_server(deciding, default_model="gen", decide_model="single")
    async with Client(server) as c:
        answer = await ok(c, "decide", {"input": "help!"})
        await ok(c, "decide", {"input": "help!", "labels": ["urgent", "later"]})
        await ok(c, "decide", {"input": "help!", "model": "mine"})
    assert answer == {"label": "urgent", "probabilities": {"urgent": 0.9}}
    bodies = [body for body, _ in plane.asked]
    assert bodies == [
        {"model": "single", "input": "help!"},
        {"model": "gen", "input": "help!", "labels": ["urgent", "later"]},
        {"model": "mine", "input": "help!"},
    ]
    assert all(caller.startswith("mcp:") for _, caller in plane.asked)


async def test_decide_refusals_say_why(deciding: Runtime, plane: DecidePlane) -> None:
    async with Client(build_server(deciding, default_model="gen")) as c:
        unlabelled = await refused(c, "decide", {"input": "x"})
        failed = await refused(c, "decide", {"input": "fail", "model": "m"})
        one_label = await refused(c, "decide", {"input": "x", "labels": ["only"]})
    assert "decide without labels needs a model" in unlabelled
    assert "decide failed (400): no such model" in failed
    assert "labels" in one_label
    assert [body["input"] for body, _ in plane.asked] == ["fail"]


# --- routes ---


async def get(server: MCPServer, path: str) -> httpx.Response:
    app = server.streamable_http_app(streamable_http_path="/mcp")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://runtime") as http:
        return await http.get(path)


async def test_health_and_ready_answer_ok_without_a_readiness_check(runtime: Runtime) -> None:
    server = build_server(runtime, default_model=MODEL)
    health, ready = await get(server, "/health"), await get(server, "/ready")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})


async def test_ready_is_503_with_the_reason_while_the_dataplane_is_not(runtime: Runtime) -> None:
    verdicts = [Verdict(ready=False, message="scheduler unreachable", at=0.0)]

    async def readiness() -> Verdict:
        return verdicts[-1]

    server = build_server(runtime, default_model=MODEL, readiness=readiness)
    not_ready = await get(server, "/ready")
    verdicts.append(Verdict(ready=True, message="", at=1.0))
    ready = await get(server, "/ready")
    assert not_ready.status_code == 503
    assert not_ready.json() == {"error": {"message": "scheduler unreachable"}}
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})


async def test_status_route_is_the_run_tree_and_metrics_count_spawns(runtime: Runtime) -> None:
    server = build_server(runtime, default_model=MODEL)
    async with Client(server) as c:
        parent = (await ok(c, "spawn", {"task": "p", "tools": ["deep_search"]}))["handle"]
        child = await ok(c, "spawn", {"task": "c", "parent": parent, "tools": ["lookup"]})
    status, metrics = await get(server, "/status"), await get(server, "/metrics")
    tree = status.json()
    assert tree["runs"] == 2 and sum(tree["byState"].values()) == 2
    [root] = tree["tree"]
    assert root["handle"] == parent
    assert [kid["handle"] for kid in root["children"]] == [child["handle"]]
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert 'luftpause_runtime_runs_spawned_total{service_class="interactive"} 2.0' in metrics.text


# --- the helpers, directly ---


def test_a_call_without_a_request_context_is_the_caller_mcp() -> None:
    assert caller_of(None) == "mcp"


def test_spec_from_fills_the_defaults_and_gives_each_run_its_own_handle() -> None:
    first = spec_from(SpawnArgs(task="t"), "caller-1", "default-model")
    second = spec_from(SpawnArgs(task="t"), "caller-1", "default-model")
    assert (first.model, first.caller, first.service_class) == (
        "default-model",
        "caller-1",
        "interactive",
    )
    assert first.handle != second.handle and first.handle.startswith("run-")


def test_spec_from_refuses_what_a_run_spec_cannot_hold_as_a_tool_error() -> None:
    with pytest.raises(ToolError, match="bad arguments: handle, task and model must not be"):
        spec_from(SpawnArgs(task="t"), "c", "")
