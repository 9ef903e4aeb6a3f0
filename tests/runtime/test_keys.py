"""Keys per caller at the runtime: the MCP door takes the keys file, a run belongs to the key
that spawned it (journaled, inherited by its children) and its turns go on behalf of that key.

The pure rules (`owners`, the ASGI wrapper, the journal) without sockets; the whole path with the
official MCP client over HTTP to the runtime under uvicorn, in front of a recording dataplane.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from luftpause.common.auth import ANYONE, Identity
from luftpause.common.keys import Keys, KeysFile, hash_key, parse_keys
from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.errors import RequestError
from luftpause.runtime.core.owners import owned
from luftpause.runtime.journal.file import JournalFile
from luftpause.runtime.loop.llm import Llm
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.loop.upstream import Upstreams
from luftpause.runtime.server.app import build_server
from luftpause.runtime.server.auth import SCOPE_KEY, BearerAuth, identity_of
from tests.runtime.loopback import Plane, plane

TOKEN = b"operator-token"
ENTRIES: list[dict[str, Any]] = [
    {"name": "team-a", "sha256": hash_key("a-key")},
    {"name": "team-b", "sha256": hash_key("b-key"), "classes": ["batch"]},
    {"name": "runtime", "sha256": hash_key("rt-key"), "acts_for": True},
]
WAIT = 10.0


def table() -> Keys:
    return parse_keys({"keys": ENTRIES})


def as_key(name: str) -> Identity:
    return Identity(key=table().named(name))


def spec(handle: str = "run-1", **kw: Any) -> m.RunSpec:
    return m.RunSpec(handle=handle, task="t", model="sim", **kw)


# --- who owns a run (pure) ---


def test_a_run_belongs_to_the_key_that_spawned_it_and_to_no_key_without_one() -> None:
    assert owned(spec(), as_key("team-a"), parent=None, keys=table()).key == "team-a"
    assert owned(spec(), ANYONE, parent=None, keys=table()).key is None
    assert owned(spec(), ANYONE, parent=None, keys=None).key is None


def test_a_child_belongs_to_its_parents_key_whoever_hangs_it_there() -> None:
    parent = spec("p", key="team-a")
    for identity in (as_key("team-a"), ANYONE, as_key("runtime")):
        child = owned(spec("c", parent="p"), identity, parent=parent, keys=table())
        assert child.key == "team-a"
    unowned = owned(spec("c", parent="p"), as_key("team-a"), parent=spec("p"), keys=table())
    assert unowned.key == "team-a"


def test_a_plain_key_may_not_hang_a_child_under_another_keys_run() -> None:
    with pytest.raises(RequestError, match="run p belongs to another key than 'team-b'"):
        owned(
            spec("c", parent="p", service_class="batch"),
            as_key("team-b"),
            parent=spec("p", key="team-a"),
            keys=table(),
        )
    acting = Identity(key=table().named("team-b"), via="runtime")  # acting for team-b: team-b
    with pytest.raises(RequestError, match="belongs to another key"):
        owned(spec("c", parent="p"), acting, parent=spec("p", key="team-a"), keys=table())


def test_a_class_the_owning_key_may_not_use_is_refused() -> None:
    with pytest.raises(RequestError, match="key 'team-b' may not use class 'interactive'"):
        owned(spec(), as_key("team-b"), parent=None, keys=table())
    assert owned(spec(service_class="batch"), as_key("team-b"), parent=None, keys=table()).key
    with pytest.raises(RequestError, match="key 'team-b' may not use class 'interactive'"):
        owned(spec("c", parent="p"), ANYONE, parent=spec("p", key="team-b"), keys=table())
    with pytest.raises(RequestError, match="key 'gone' is no longer in the keys file"):
        owned(spec("c", parent="p"), ANYONE, parent=spec("p", key="gone"), keys=table())


# --- the journal ---


def test_the_key_is_journaled_by_name_and_old_specs_read_as_no_key() -> None:
    record = j.spawned_record(spec(key="team-a"))
    assert record["spec"]["key"] == "team-a"
    assert "a-key" not in json.dumps(record)
    assert m.RunSpec.from_json(record["spec"]).key == "team-a"
    old = j.spawned_record(spec())
    assert "key" not in old["spec"] and m.RunSpec.from_json(old["spec"]).key is None
    assert j.replay([record]).runs["run-1"].spec.key == "team-a"
    assert j.replay([old]).runs["run-1"].spec.key is None


# --- the MCP door (ASGI, no sockets) ---


@pytest.fixture
def keys_file(tmp_path: Path) -> KeysFile:
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": ENTRIES}))
    return KeysFile(path)


async def door(keys: KeysFile, auth: str | None, **headers: str) -> tuple[int, Identity | None]:
    """The status the ASGI wrapper answers, and the identity the app behind it was given."""
    seen: list[Identity] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope[SCOPE_KEY])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw = {"authorization": auth, **headers} if auth is not None else headers
    scope = {
        "type": "http",
        "path": "/mcp",
        "headers": [(k.encode(), v.encode()) for k, v in raw.items()],
    }
    await BearerAuth(app, TOKEN, keys)(scope, None, send)
    assert SCOPE_KEY not in scope  # the caller's scope is left alone
    return sent[0]["status"], seen[0] if seen else None


async def test_the_door_takes_keys_and_the_token_and_hands_on_who_it_was(
    keys_file: KeysFile,
) -> None:
    status, identity = await door(keys_file, "Bearer a-key")
    assert status == 200 and identity is not None and identity.caller == "team-a"
    status, identity = await door(keys_file, "Bearer operator-token")
    assert status == 200 and identity == ANYONE
    acting = {"x-luftpause-on-behalf-of": "team-b"}
    status, identity = await door(keys_file, "Bearer rt-key", **acting)
    assert identity is not None and identity.caller == "team-b"


async def test_the_door_refuses_unknown_keys_and_acting_for_others(keys_file: KeysFile) -> None:
    assert (await door(keys_file, "Bearer c-key"))[0] == 401
    assert (await door(keys_file, None))[0] == 401
    acting = {"x-luftpause-on-behalf-of": "team-b"}
    assert (await door(keys_file, "Bearer a-key", **acting))[0] == 403


def test_the_identity_of_a_request_without_one_is_anyone() -> None:
    assert identity_of(object()) == ANYONE


# --- the whole path over HTTP ---


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """`app` under uvicorn on loopback; its base URL."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = _Uvicorn(uvicorn.Config(app, log_config=None, access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(WAIT):
            while not server.started:
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@dataclass
class Door:
    url: str
    runtime: Runtime
    plane: Plane
    journal: Path


@pytest.fixture
async def door_open(tmp_path: Path, keys_file: KeysFile) -> AsyncIterator[Door]:
    keys = keys_file
    async with plane() as fake:
        llm = Llm(fake.url, timeout=WAIT, token="rt-key")
        upstreams = Upstreams([])
        upstreams.start()
        runtime = Runtime(JournalFile(tmp_path / "state"), llm, upstreams)
        runtime.resume()
        server = build_server(runtime, default_model="sim", decide_model="clf", keys=keys)
        app = BearerAuth(server.streamable_http_app(streamable_http_path="/mcp"), TOKEN, keys)
        try:
            async with serving(app) as url:
                yield Door(url, runtime, fake, tmp_path / "state" / "runs.jsonl")
        finally:
            await runtime.stop()
            await upstreams.close()
            await llm.close()


async def call(door: Door, key: str, tool: str, args: dict[str, Any]) -> CallToolResult:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=WAIT)
    transport = streamable_http_client(door.url + "/mcp", http_client=http)
    async with http, asyncio.timeout(WAIT), Client(transport) as client:
        return await client.call_tool(tool, args)


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def test_a_run_spawned_with_a_key_is_its_turns_go_on_its_behalf(door_open: Door) -> None:
    result = await call(door_open, "a-key", "run", {"task": "rivers"})
    assert not result.is_error, text(result)
    data: Any = result.structured_content
    run = door_open.runtime.runs[data["handle"]]
    assert run.state.spec.key == "team-a" and data["state"] == "finished"
    turn = door_open.plane.turns[-1]
    assert turn["x-luftpause-on-behalf-of"] == "team-a"
    assert turn["Authorization"] == "Bearer rt-key"  # the runtime's own key, not the client's
    assert turn["x-luftpause-caller"] == run.state.spec.caller  # the session: a sub-caller
    spawned = json.loads(door_open.journal.read_text().splitlines()[0])
    assert spawned["spec"]["key"] == "team-a" and "a-key" not in door_open.journal.read_text()


async def test_a_class_the_key_may_not_use_refuses_the_spawn(door_open: Door) -> None:
    refused = await call(door_open, "b-key", "spawn", {"task": "rivers"})
    assert refused.is_error and "key 'team-b' may not use class 'interactive'" in text(refused)
    allowed = await call(door_open, "b-key", "spawn", {"task": "r", "serviceClass": "batch"})
    assert not allowed.is_error, text(allowed)
    assert list(door_open.runtime.runs) == [allowed.structured_content["handle"]]


async def test_children_stay_with_their_parents_key(door_open: Door) -> None:
    parent: Any = (await call(door_open, "a-key", "spawn", {"task": "p"})).structured_content
    by_operator = await call(
        door_open, "operator-token", "spawn", {"task": "c", "parent": parent["handle"]}
    )
    child = door_open.runtime.runs[by_operator.structured_content["handle"]]
    assert child.state.spec.key == "team-a"
    args = {"task": "c", "parent": parent["handle"], "serviceClass": "batch"}
    other = await call(door_open, "b-key", "spawn", args)
    assert other.is_error and "belongs to another key" in text(other)


async def test_a_decision_goes_on_behalf_of_the_key_that_asked(door_open: Door) -> None:
    result = await call(door_open, "a-key", "decide", {"input": "x"})
    assert not result.is_error, text(result)
    assert door_open.plane.turns[-1]["x-luftpause-on-behalf-of"] == "team-a"


async def test_an_unknown_key_is_refused_at_the_door(door_open: Door) -> None:
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        resp = await http.post(
            door_open.url + "/mcp", headers={"Authorization": "Bearer c-key"}, json={}
        )
    assert resp.status_code == 401 and resp.json()["error"]["message"]


async def test_a_plain_key_sees_and_touches_only_its_own_keys_runs(door_open: Door) -> None:
    """team-b cannot await, cancel, approve or forecast team-a's run, nor see it in status;
    the operator and team-a can."""
    mine: Any = (await call(door_open, "a-key", "run", {"task": "rivers"})).structured_content
    handle = mine["handle"]
    for tool, args in (
        ("await", {"handles": [handle], "timeout": 1}),
        ("cancel", {"handle": handle}),
        ("approve", {"handle": handle, "allow": True}),
        ("forecast", {"handle": handle}),
        ("status", {"handles": [handle]}),
    ):
        refused = await call(door_open, "b-key", tool, args)
        assert refused.is_error and "belongs to another key" in text(refused), tool
    theirs: Any = (await call(door_open, "b-key", "status", {})).structured_content
    assert handle not in [r["handle"] for r in theirs["runs"]]
    for key in ("a-key", "operator-token"):
        seen: Any = (await call(door_open, key, "status", {"handles": [handle]})).structured_content
        assert [r["handle"] for r in seen["runs"]] == [handle]
