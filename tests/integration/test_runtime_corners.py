"""Corners of the MCP runtime end to end: the official `mcp` client -> runtime -> dataplane ->
engines, tool calls to fake-mcp, every process real on loopback.

The pool: two simulated generative engines, a simulated single-pass classifier (for `decide`
without labels), and `TwoCalls`, an OpenAI-compatible engine served by this module whose model
asks for two lookups in one reply (the simulator asks for one at a time). What is checked:

- a finished run is ended at the dataplane (the runtime's DELETE /v1/runs/{id}): the scheduler
  forgets it and the dataplane no longer knows its tool call ids;
- spawn's `maxTokens` reaches the engine as `max_tokens`, and 0 leaves it out;
- `await` with mode `any` returns once the first of several runs is over;
- with `parallelToolCalls` the two calls of one reply are in flight at fake-mcp at once, and
  without it only the first is made;
- `decide` without labels is answered by the single-pass replica.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from mcp import Client

from luftpause.testkit.procs import free_port
from luftpause.testkit.stack import Endpoint, Launcher, write_endpoints
from luftpause.testkit.status import fetch_status
from luftpause.testkit.waits import WAIT_SECONDS, eventually, local_url, until_status

pytestmark = pytest.mark.asyncio(loop_scope="module")

GEN_MODEL = "luftpause-sim"
CLF_MODEL = "sim-classifier"
CLF_LABELS = ("urgent", "lookup", "chitchat")
TWO_CALLS_MODEL = "two-calls"
TOOL_ROUNDS = 2  # the simulated model calls a tool this many times, then answers
LOOKUP_SECONDS = 0.5  # each lookup at fake-mcp: two at once overlap for about this long


@dataclass
class TwoCalls:
    """An engine whose model answers a turn without tool results with two `lookup` calls (when
    tools are offered), and any later turn with text. Keeps every request body."""

    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        answered = any(m.get("role") == "tool" for m in body["messages"])
        message: dict[str, Any] = {"role": "assistant", "content": "both rivers are long"}
        if body.get("tools") and body.get("tool_choice") != "none" and not answered:
            message = {"role": "assistant", "content": None, "tool_calls": _two_lookups()}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "system_fingerprint": "two-calls",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30},
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})


def _two_lookups() -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:16]}",
            "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"query": river})},
        }
        for river in ("Loire", "Rhine")
    ]


@dataclass
class Corners:
    workdir: Path
    engines: dict[str, str]  # replica id -> base URL
    dataplane: str
    status_url: str
    fake_mcp: str
    mcp_url: str
    two_calls: TwoCalls

    def journal(self) -> list[dict[str, Any]]:
        lines = (self.workdir / "runtime-state" / "runs.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def corners(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Corners]:
    workdir = tmp_path_factory.mktemp("corners")
    two_calls = TwoCalls()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", two_calls.chat)
    app.router.add_get("/health", two_calls.health)
    async with AsyncExitStack() as exits:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        exits.push_async_callback(runner.cleanup)
        two_calls_port = free_port()
        await web.TCPSite(runner, "127.0.0.1", two_calls_port).start()
        launcher = Launcher(workdir, exits)
        fast = ("--time-scale", "20")
        sims = [
            await launcher.engine(eid, *fast, "--tool-rounds", str(TOOL_ROUNDS), models=[GEN_MODEL])
            for eid in ("sim-0", "sim-1")
        ]
        labels = ("--kind", "single-pass", "--labels", ",".join(CLF_LABELS))
        classifier = await launcher.engine(
            "clf-0", *labels, *fast, models=[CLF_MODEL], options={"kind": "single-pass"}
        )
        own = Endpoint(
            id="two-calls",
            url=local_url(two_calls_port),
            models=(TWO_CALLS_MODEL,),
            options={"metrics": ""},
        )
        endpoints = [*sims, classifier, own]
        config = write_endpoints(workdir / "endpoints.yaml", endpoints)
        scheduler = await launcher.scheduler(config)
        dataplane = await launcher.dataplane(scheduler, config=config, ready="/ready")
        mcp, runtime = free_port(), free_port()
        fake_mcp = local_url(mcp)
        tools = ("--lookup-latency", str(LOOKUP_SECONDS), "--deep-search-latency", "5")
        await launcher.spawn(
            "fake-mcp", ["fake-mcp", "--port", str(mcp), *tools], f"{fake_mcp}/health"
        )
        args = ["runtime", "--port", str(runtime), "--dataplane", dataplane.url]
        args += ["--decide-model", CLF_MODEL, "--mcp-server", f"{fake_mcp}/mcp"]
        args += ["--state-dir", str(workdir / "runtime-state")]
        await launcher.spawn("runtime", args, local_url(runtime) + "/health")
        await until_status(
            scheduler.status_url,
            lambda st: all(r["healthy"] for r in st["replicas"]),
            "every replica healthy",
        )
        yield Corners(
            workdir=workdir,
            engines={e.id: e.url for e in endpoints},
            dataplane=dataplane.url,
            status_url=scheduler.status_url,
            fake_mcp=fake_mcp,
            mcp_url=local_url(runtime) + "/mcp",
            two_calls=two_calls,
        )


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        assert resp.status == 200, url
        return await resp.json()


async def chat(corners: Corners, body: dict[str, Any], **headers: str) -> tuple[str, Any]:
    """One turn straight at the dataplane: the run id it answered under, and the reply."""
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{corners.dataplane}/v1/chat/completions", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return resp.headers["x-luftpause-run-id"], await resp.json()


async def echo(corners: Corners, call_id: str) -> str:
    """A turn without a run id that echoes the result of tool call `call_id`: the run id the
    dataplane gives it (the run that made the call, while the dataplane remembers it)."""
    call = {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "how long is the Loire?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": "1006 km"},
    ]
    run_id, _ = await chat(corners, {"model": GEN_MODEL, "messages": messages, "max_tokens": 4})
    return run_id


async def until_journaled(corners: Corners, handle: str, kind: str) -> dict[str, Any]:
    """The first journal record of `kind` for `handle`."""

    async def records() -> list[dict[str, Any]]:
        return [r for r in corners.journal() if r["run"] == handle and r["type"] == kind]

    found = await eventually(records, bool, f"a {kind!r} record of {handle} in the journal")
    return found[0]


async def test_a_finished_run_is_ended_at_the_dataplane_and_the_scheduler_forgets_it(
    corners: Corners,
) -> None:
    # An own-loop run nobody ends: the dataplane knows it by the tool call it echoes back.
    lookup = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    body = {"model": GEN_MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [lookup]}
    _, reply = await chat(corners, body, **{"x-luftpause-run-id": "corner-kept"})
    assert await echo(corners, reply["choices"][0]["message"]["tool_calls"][0]["id"]) == (
        "corner-kept"
    )
    before = (await fetch_status(corners.status_url))["runs_total"]
    async with asyncio.timeout(3 * WAIT_SECONDS), Client(corners.mcp_url) as c:
        args = {"task": "t", "tools": ["lookup"], "maxToolCalls": 1, "approveTools": ["lookup"]}
        handle = (await call(c, "spawn", args))["handle"]
        asked = await until_journaled(corners, handle, "turn")  # paused on its tool call
        await until_status(
            corners.status_url,
            lambda st: st["runs_total"] == before + 1,
            f"the scheduler to know run {handle}",
        )
        await call(c, "approve", {"handle": handle, "allow": True})
        [run] = (await call(c, "await", {"handles": [handle], "timeout": 20}))["runs"]
        assert run["state"] == "finished" and run["toolCalls"] == 1, run
        await until_status(
            corners.status_url,
            lambda st: st["runs_total"] == before,
            f"the scheduler to forget the finished run {handle}",
        )
    # The dataplane forgot the run's tool call: echoing it now starts a run of its own.
    assert await echo(corners, asked["asking"]) not in (handle, "corner-kept")


@pytest.mark.parametrize(("max_tokens", "sent"), [(7, 7), (0, None), (None, 256)])
async def test_spawn_max_tokens_reaches_the_engine_as_max_tokens_and_0_leaves_it_out(
    corners: Corners, max_tokens: int | None, sent: int | None
) -> None:
    logs = [f"{corners.engines[e]}/debug/requests" for e in ("sim-0", "sim-1")]
    before = [len((await get_json(url))["requests"]) for url in logs]
    args: dict[str, Any] = {"task": "t", "tools": ["lookup"], "maxToolCalls": 1}
    if max_tokens is not None:
        args["maxTokens"] = max_tokens
    async with asyncio.timeout(30), Client(corners.mcp_url) as c:
        handle = (await call(c, "spawn", args))["handle"]
        [run] = (await call(c, "await", {"handles": [handle], "timeout": 20}))["runs"]
    assert run["state"] == "finished" and run["turns"] == 2, run
    seen = [
        r
        for url, n in zip(logs, before, strict=True)
        for r in (await get_json(url))["requests"][n:]
        if r["path"] == "/v1/chat/completions"
    ]
    assert [r["max_tokens"] for r in seen] == [sent, sent]


async def test_await_any_returns_once_the_first_of_several_runs_is_over(corners: Corners) -> None:
    async with asyncio.timeout(30), Client(corners.mcp_url) as c:
        # Held at its first tool call until approved: it cannot end while await waits.
        held = {"task": "held", "tools": ["lookup"], "approveTools": ["lookup"]}
        slow = (await call(c, "spawn", held))["handle"]
        fast = (await call(c, "spawn", {"task": "quick", "maxToolCalls": 0}))["handle"]
        out = await call(c, "await", {"handles": [slow, fast], "mode": "any", "timeout": 600})
        await call(c, "cancel", {"handle": slow})
    states = {r["handle"]: r["state"] for r in out["runs"]}
    assert states[fast] == "finished"
    assert states[slow] in ("running", "tools", "AwaitingApproval")


async def _peak_lookups(corners: Corners, done: asyncio.Event) -> int:
    """The most lookups fake-mcp had in flight at once until `done` is set."""
    peak = 0
    async with aiohttp.ClientSession() as s:
        while not done.is_set():
            async with s.get(f"{corners.fake_mcp}/stats") as resp:
                peak = max(peak, (await resp.json())["in_flight"]["lookup"])
            await asyncio.sleep(0.01)
    return peak


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "one-at-a-time"])
async def test_the_tool_calls_of_one_reply_run_at_once_only_with_parallel_tool_calls(
    corners: Corners, parallel: bool
) -> None:
    before = (await get_json(f"{corners.fake_mcp}/stats"))["calls"]["lookup"]
    done = asyncio.Event()
    watching = asyncio.create_task(_peak_lookups(corners, done))
    args = {"task": "t", "model": TWO_CALLS_MODEL, "tools": ["lookup"]}
    try:
        async with asyncio.timeout(30), Client(corners.mcp_url) as c:
            spawned = await call(c, "spawn", {**args, "parallelToolCalls": parallel})
            out = await call(c, "await", {"handles": [spawned["handle"]], "timeout": 20})
    finally:
        done.set()
    peak = await watching
    [run] = out["runs"]
    calls = 2 if parallel else 1
    assert run["state"] == "finished" and run["toolCalls"] == calls, run
    assert peak == calls  # two lookups overlapped at fake-mcp, or one ran alone
    after = (await get_json(f"{corners.fake_mcp}/stats"))["calls"]["lookup"]
    assert after - before == calls
    answered = corners.two_calls.bodies[-1]["messages"]
    assert len([m for m in answered if m["role"] == "tool"]) == calls


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_decide_without_labels_is_answered_by_the_single_pass_replica(
    corners: Corners, mode: str
) -> None:
    log = f"{corners.engines['clf-0']}/debug/requests"
    before = len((await get_json(log))["requests"])
    async with asyncio.timeout(30), Client(corners.mcp_url, mode=mode) as c:
        out = await call(c, "decide", {"input": "the server returned 500 three times"})
    assert out["model"] == CLF_MODEL
    [item] = out["data"]
    assert item["label"] in CLF_LABELS and len(item["probs"]) == len(CLF_LABELS)
    classified = (await get_json(log))["requests"][before:]
    assert [(r["method"], r["path"]) for r in classified] == [("POST", "/classify")]
