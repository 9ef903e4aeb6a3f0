"""Fork, export and import over the official `mcp` client's in-memory connection (and httpx over
ASGI for the /runs routes), in front of real `Runtime`s whose model is the engine simulator and
whose tools are the fake MCP server, on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent

from luftpause.common.auth import ANYONE
from luftpause.runtime.core import bundle as b
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.errors import Forbidden
from luftpause.runtime.journal.moves import Migrations
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.server.app import build_server
from luftpause.runtime.server.auth import BearerAuth
from luftpause.testkit.engine.server import RunningServer
from luftpause.testkit.waits import eventually
from tests.runtime.loopback import MODEL, FakeMcp, engine, runtime_on
from tests.runtime.test_keys import as_key

WAIT = 10.0


@pytest.fixture
async def model() -> AsyncIterator[RunningServer]:
    async with engine(tool_rounds=2) as server:
        yield server


@pytest.fixture
async def runtime(tmp_path: Path, model: RunningServer, tools: FakeMcp) -> AsyncIterator[Runtime]:
    async with runtime_on(tmp_path / "a", model.url, [tools.url]) as rt:
        yield rt


@pytest.fixture
async def other(tmp_path: Path, model: RunningServer, tools: FakeMcp) -> AsyncIterator[Runtime]:
    """A second runtime with its own state dir: where bundles go."""
    async with runtime_on(tmp_path / "b", model.url, [tools.url]) as rt:
        yield rt


def connect(runtime: Runtime) -> Client:
    return Client(build_server(runtime, default_model=MODEL))


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def ok(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, text(result)
    assert result.structured_content is not None
    return result.structured_content


async def refused(client: Client, tool: str, args: dict[str, Any]) -> str:
    result = await client.call_tool(tool, args)
    assert result.is_error, result
    message = text(result)
    assert "Traceback" not in message
    return message


def journal_file(runtime: Runtime) -> Path:
    """The runtime's journal: a file, for these runtimes."""
    path = runtime.journal.path
    assert isinstance(path, Path), "a file journal"
    return path


def journal_of(runtime: Runtime) -> list[dict[str, Any]]:
    return [json.loads(line) for line in journal_file(runtime).read_text().splitlines()]


async def finished_run(client: Client, **args: Any) -> str:
    out = await ok(client, "run", {"task": "rivers", "tools": ["lookup"], "timeout": WAIT, **args})
    assert out["state"] == "finished", out
    return str(out["handle"])


async def asking(runtime: Runtime, handle: str) -> None:
    """Until the run's task waits for the user's answer."""

    async def pending() -> int:
        return len(runtime.approvals.pending([handle]))

    await eventually(pending, bool, f"{handle} asking for approval", timeout=WAIT)


# --- fork ---


async def test_n_forks_of_a_finished_run_go_on_from_its_last_round_and_finish(
    runtime: Runtime,
) -> None:
    async with connect(runtime) as c:
        source = await finished_run(c, budgetTokens=100_000, serviceClass="batch")
        before = runtime.runs[source].state
        out = await ok(c, "fork", {"handle": source, "n": 3, "instructions": ["a", "b", "c"]})
        assert out["from"] == source and out["round"] == 2 and len(set(out["handles"])) == 3
        done = await ok(c, "await", {"handles": out["handles"], "timeout": WAIT})
    assert all(r["state"] == "finished" and r["result"] for r in done["runs"])
    # The fork's history is the source's two rounds (turns: 2 copied, not the source's answer)
    # and its own answer; its counters went on from the source's.
    assert all(r["toolCalls"] == 2 and r["turns"] == 3 for r in done["runs"])
    for handle, instruction in zip(out["handles"], "abc", strict=True):
        state = runtime.runs[handle].state
        assert state.messages[: len(before.messages)] == before.messages
        assert state.messages[len(before.messages)] == {"role": "user", "content": instruction}
        assert (state.spec.budget_tokens, state.spec.service_class) == (100_000, "batch")
        assert state.spec.parent == before.spec.parent and state.spec.handle == handle
    assert runtime.runs[source].state == before  # the source is not touched
    batches = [r for r in journal_of(runtime) if r["type"] == "batch"]
    [batch] = [b for b in batches if b["records"][0]["type"] == "forked"]
    assert [r["type"] for r in batch["records"]] == ["forked"] * 3
    assert all(len(r["learned"]) == 2 and r["from"] == source for r in batch["records"])


async def test_a_fork_can_change_model_class_and_budgets(runtime: Runtime) -> None:
    async with connect(runtime) as c:
        source = await finished_run(c)
        args = {"handle": source, "serviceClass": "batch", "budgetToolCalls": 9, "model": MODEL}
        [fork] = (await ok(c, "fork", args))["handles"]
        await ok(c, "await", {"handles": [fork], "timeout": WAIT})
    spec = runtime.runs[fork].state.spec
    assert (spec.service_class, spec.budget_tool_calls, spec.budget_tokens) == ("batch", 9, None)


async def test_a_fork_of_a_run_waiting_on_a_call_takes_its_own_turn_and_calls(
    runtime: Runtime, tools: FakeMcp
) -> None:
    async with connect(runtime) as c:
        source = (await ok(c, "spawn", {"task": "slow", "tools": ["deep_search"]}))["handle"]
        await ok(c, "await", {"handles": [source], "timeout": 0.5})
        waiting = runtime.runs[source].state
        assert waiting.phase is m.Phase.TOOLS and waiting.rounds == 0
        [fork] = (await ok(c, "fork", {"handle": source, "instructions": "go"}))["handles"]
        await ok(c, "await", {"handles": [fork], "timeout": 0.5})
        mine = runtime.runs[fork].state
        assert mine.phase is m.Phase.TOOLS and mine.rounds == 0
        assert {x.id for x in mine.pending}.isdisjoint(x.id for x in waiting.pending)
        assert runtime.runs[source].state.pending == waiting.pending  # undisturbed
        await ok(c, "cancel", {"handle": source})
        await ok(c, "cancel", {"handle": fork})
    assert tools.stats.calls["deep_search"] == 2


async def test_a_fork_of_a_run_awaiting_approval_forks_from_its_start(runtime: Runtime) -> None:
    async with connect(runtime) as c:
        spawn = {"task": "tidy", "tools": ["delete_record"], "maxToolCalls": 1}
        source = (await ok(c, "spawn", spawn))["handle"]
        await ok(c, "await", {"handles": [source], "timeout": 0.5})
        assert runtime.runs[source].state.phase is m.Phase.AWAITING_APPROVAL
        [fork] = (await ok(c, "fork", {"handle": source}))["handles"]
        await ok(c, "await", {"handles": [fork], "timeout": 0.5})
        assert runtime.runs[fork].state.phase is m.Phase.AWAITING_APPROVAL
        await ok(c, "approve", {"handle": fork, "allow": False})
        await ok(c, "approve", {"handle": source, "allow": True})
        done = await ok(c, "await", {"handles": [source, fork], "timeout": WAIT})
    assert [r["state"] for r in done["runs"]] == ["finished", "finished"]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"handle": "run-nope"}, "no run run-nope"),
        ({"n": 0}, "greater than or equal to 1"),
        ({"n": 17}, "less than or equal to 16"),
        ({"n": 2, "instructions": ["only one"]}, "1 given for 2"),
        ({"n": 2, "instructions": [1, 2]}, "instructions"),
        ({"serviceClass": "urgent"}, "serviceClass"),
        ({"budgetTokens": -1}, "budgetTokens"),
    ],
)
async def test_bad_fork_arguments_are_refused_with_nothing_journaled(
    runtime: Runtime, args: dict[str, Any], why: str
) -> None:
    async with connect(runtime) as c:
        source = await finished_run(c)
        before = journal_file(runtime).read_bytes()
        assert why in await refused(c, "fork", {"handle": source, **args})
    assert journal_file(runtime).read_bytes() == before


async def test_a_fork_belongs_to_its_sources_key_which_another_key_may_not_fork(
    runtime: Runtime,
) -> None:
    spec = m.RunSpec(handle="run-a", task="t", model=MODEL, tools=("lookup",), key="team-a")
    source = await runtime.spawn(spec)
    await runtime.await_runs([source], "all", WAIT)
    migrations = Migrations(runtime)
    with pytest.raises(Forbidden, match="another key"):
        await migrations.fork(source, 1, None, as_key("team-b"), "mcp")
    handles, _ = await migrations.fork(source, 1, None, ANYONE, "mcp")
    assert runtime.runs[handles[0]].state.spec.key == "team-a"
    with pytest.raises(Forbidden):
        await migrations.export(source, as_key("team-b"))


# --- export and import ---


async def test_a_run_waiting_for_approval_moves_to_another_runtime_and_finishes_there(
    runtime: Runtime, other: Runtime, tools: FakeMcp
) -> None:
    async with connect(runtime) as c:
        source = await finished_run(c, maxToolCalls=1)
        spawn = {"task": "tidy", "tools": ["delete_record"], "parent": source, "maxToolCalls": 1}
        child = (await ok(c, "spawn", spawn))["handle"]
        await ok(c, "await", {"handles": [child], "timeout": 0.5})
        exported = await ok(c, "export", {"handle": source, "subtree": True})
    assert [r["handle"] for r in exported["runs"]] == [source, child]
    assert exported["runs"][1] == {"handle": child, "state": "AwaitingApproval", "round": 0}
    async with connect(other) as c:
        out = await ok(c, "import", {"bundle": exported["bundle"]})
        assert out["imported"] == [source, child]
        assert [r["state"] for r in out["runs"]] == ["finished", "AwaitingApproval"]
        await asking(other, child)  # its task asks again, as after a restart
        await ok(c, "approve", {"handle": child, "allow": True})
        [done] = (await ok(c, "await", {"handles": [child], "timeout": WAIT}))["runs"]
        again = await refused(c, "import", {"bundle": exported["bundle"]})
    assert done["state"] == "finished" and done["parent"] == source
    assert "already exist" in again
    assert runtime.runs[child].state.phase is m.Phase.AWAITING_APPROVAL  # the copy stays here
    assert tools.stats.calls["delete_record"] == 1


async def test_a_fork_exported_alone_resumes_elsewhere_from_its_own_records(
    runtime: Runtime, other: Runtime
) -> None:
    async with connect(runtime) as c:
        source = await finished_run(c)
        [fork] = (await ok(c, "fork", {"handle": source, "instructions": "again"}))["handles"]
        await ok(c, "await", {"handles": [fork], "timeout": WAIT})
        exported = await ok(c, "export", {"handle": fork})
    doc = json.loads(exported["bundle"])
    assert {r["run"] for r in doc["records"]} == {fork} and doc["records"][0]["type"] == "forked"
    async with connect(other) as c:
        await ok(c, "import", {"bundle": exported["bundle"]})
    assert m.canonical(other.runs[fork].state) == m.canonical(runtime.runs[fork].state)


def bad_bundles(good: str) -> dict[str, Any]:
    doc = json.loads(good)
    newer = dict(doc, version=2)
    forged = json.loads(good)
    forged["records"][0]["spec"]["task"] = "something else"
    return {
        "not json": "{oops",
        "not a bundle": json.dumps({"format": "tarball", "version": 1}),
        "newer": json.dumps(newer),
        "corrupt": json.dumps(forged),
        "truncated": good[: len(good) // 2],
        "empty": "",
    }


async def test_every_bad_bundle_is_refused_with_nothing_journaled(
    runtime: Runtime, other: Runtime
) -> None:
    async with connect(runtime) as c:
        good = (await ok(c, "export", {"handle": await finished_run(c)}))["bundle"]
    async with connect(other) as c:
        await ok(c, "status", {})
        before = journal_file(other).read_bytes()
        messages = {
            k: await refused(c, "import", {"bundle": v}) for k, v in bad_bundles(good).items()
        }
        assert "valid string" in await refused(c, "import", {"bundle": 42})
        assert "valid string" in await refused(c, "import", {"bundle": {"format": b.FORMAT}})
    assert "newer" in messages["newer"] and "corrupt" in messages["corrupt"]
    assert "not JSON" in messages["not json"] and "not a luftpause" in messages["not a bundle"]
    assert journal_file(other).read_bytes() == before and other.runs == {}


# --- the HTTP routes ---


async def test_scripts_export_and_import_over_http_behind_the_same_auth(
    runtime: Runtime, other: Runtime
) -> None:
    async with connect(runtime) as c:
        source = await finished_run(c)
    token = b"sesame"
    here = BearerAuth(
        build_server(runtime, default_model=MODEL).streamable_http_app(streamable_http_path="/mcp"),
        token,
    )
    there = BearerAuth(
        build_server(other, default_model=MODEL).streamable_http_app(streamable_http_path="/mcp"),
        token,
    )
    auth = {"Authorization": "Bearer sesame"}
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=here), base_url="http://a") as a,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=there), base_url="http://b") as b_,
    ):
        assert (await a.get(f"/runs/{source}/export")).status_code == 401
        missing = await a.get("/runs/run-nope/export", headers=auth)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "no_run"
        exported = await a.get(f"/runs/{source}/export?subtree=true", headers=auth)
        assert exported.status_code == 200 and exported.json()["format"] == b.FORMAT
        assert (await b_.post("/runs/import", content=exported.content)).status_code == 401
        made = await b_.post("/runs/import", content=exported.content, headers=auth)
        assert made.status_code == 200 and made.json() == {"imported": [source]}
        twice = await b_.post("/runs/import", content=exported.content, headers=auth)
        assert twice.status_code == 409 and "already exist" in twice.json()["error"]["message"]
        junk = await b_.post("/runs/import", content=b"{junk", headers=auth)
        assert junk.status_code == 400 and junk.json()["error"]["code"] == "bundle_malformed"
    assert other.runs[source].state.phase is m.Phase.FINISHED
