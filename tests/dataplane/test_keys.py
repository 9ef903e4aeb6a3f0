"""Keys per caller through the app: the key names the caller, its classes and its budget."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from luftpause.common.keys import KeysFile, hash_key
from luftpause.dataplane.main import main, parse_args
from luftpause.rpc import scheduler_pb2 as pb
from tests.dataplane.conftest import Stack, running_stack
from tests.dataplane.fakes import MODEL

TOKEN = b"operator-token"
ENTRIES: list[dict[str, Any]] = [
    {"name": "team-a", "sha256": hash_key("a-key"), "tokens_per_minute": 20000, "daily_tokens": 9},
    {"name": "team-b", "sha256": hash_key("b-key"), "classes": ["batch"]},
    {"name": "runtime", "sha256": hash_key("rt-key"), "acts_for": True},
]


def write_keys(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"keys": entries}))
    return path


@pytest.fixture
async def keyed(tmp_path: Path) -> AsyncIterator[Stack]:
    # Looked at on every request, so a change shows without waiting a second.
    keys = KeysFile(write_keys(tmp_path / "keys.yaml", ENTRIES), check_seconds=0)
    async with running_stack(token=TOKEN, keys=keys) as s:
        yield s


def bearer(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


async def admitted(stack: Stack, **headers: str) -> pb.AdmitRequest:
    """Post a turn that must pass; the Admit it caused."""
    status, _, body = await stack.post(stack.chat(), **headers)
    assert status == 200, body
    return stack.scheduler.admits[-1]


@pytest.mark.parametrize(
    ("sent", "caller"),
    [
        (None, "team-a"),
        ("team-a", "team-a"),
        ("team-a/agent-7", "team-a/agent-7"),
        ("team-b", "team-a/team-b"),
        ("team-ab", "team-a/team-ab"),
        ("x" * 200, "team-a/" + "x" * (128 - len("team-a/"))),
    ],
)
async def test_the_key_names_the_caller_and_the_header_only_narrows_it(
    keyed: Stack, sent: str | None, caller: str
) -> None:
    headers = bearer("a-key", **({"x-luftpause-caller": sent} if sent is not None else {}))
    async with asyncio.timeout(10):
        admit = await admitted(keyed, **headers)
    assert admit.caller == caller


async def test_the_turn_carries_its_keys_name_and_budget_to_the_scheduler(keyed: Stack) -> None:
    async with asyncio.timeout(10):
        admit = await admitted(keyed, **bearer("a-key"))
        plain = await admitted(keyed, **bearer("b-key", **{"x-luftpause-class": "batch"}))
    assert admit.HasField("key")
    assert (admit.key.name, admit.key.tokens_per_minute, admit.key.daily_tokens) == (
        "team-a",
        20000,
        9,
    )
    assert admit.key.requests_per_minute == 0
    assert plain.key.name == "team-b" and plain.key.tokens_per_minute == 0


async def test_the_operator_token_still_names_any_caller_without_a_budget(keyed: Stack) -> None:
    async with asyncio.timeout(10):
        admit = await admitted(keyed, **bearer("operator-token", **{"x-luftpause-caller": "ops"}))
    assert admit.caller == "ops" and not admit.HasField("key")


async def test_a_class_the_key_may_not_use_is_a_json_403_that_reaches_nobody(
    keyed: Stack,
) -> None:
    async with asyncio.timeout(10):
        status, headers, body = await keyed.post(keyed.chat(), **bearer("b-key"))
        decided = await keyed.http.post(
            keyed.url + "/v1/decide",
            json={"model": MODEL, "input": "x"},
            headers=bearer("b-key", **{"x-luftpause-class": "batch"}),
        )
        async with decided:
            assert decided.status == 403  # a decision is an interactive turn
    assert status == 403 and headers["x-luftpause-run-id"]
    assert json.loads(body) == {
        "error": {"message": "key 'team-b' may not use class 'interactive'"}
    }
    assert keyed.scheduler.admits == [] and keyed.engine.seen == []


async def test_an_unknown_key_is_a_401(keyed: Stack) -> None:
    async with asyncio.timeout(10):
        status, headers, body = await keyed.post(keyed.chat(), **bearer("c-key"))
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert "bearer token" in json.loads(body)["error"]["message"]


async def test_a_service_key_acts_for_a_key_with_its_caller_classes_and_budget(
    keyed: Stack,
) -> None:
    acting = {"x-luftpause-on-behalf-of": "team-a", "x-luftpause-caller": "mcp-session-1"}
    async with asyncio.timeout(10):
        admit = await admitted(keyed, **bearer("rt-key", **acting))
        for_b = {**acting, "x-luftpause-on-behalf-of": "team-b"}
        refused, _, body = await keyed.post(keyed.chat(), **bearer("rt-key", **for_b))
    assert admit.caller == "team-a/mcp-session-1" and admit.key.tokens_per_minute == 20000
    assert refused == 403 and "team-b" in json.loads(body)["error"]["message"]


async def test_only_a_service_key_may_act_for_another_and_only_for_a_known_one(
    keyed: Stack,
) -> None:
    async with asyncio.timeout(10):
        plain, _, body = await keyed.post(
            keyed.chat(), **bearer("a-key", **{"x-luftpause-on-behalf-of": "team-b"})
        )
        unknown, _, _ = await keyed.post(
            keyed.chat(), **bearer("rt-key", **{"x-luftpause-on-behalf-of": "team-z"})
        )
    assert plain == 403 and "may not act for other keys" in json.loads(body)["error"]["message"]
    assert unknown == 403 and keyed.scheduler.admits == []


async def test_a_key_added_to_the_file_while_running_is_accepted(
    keyed: Stack, tmp_path: Path
) -> None:
    async with asyncio.timeout(10):
        before, _, _ = await keyed.post(keyed.chat(), **bearer("new-key"))
        new = {"name": "team-new", "sha256": hash_key("new-key")}
        write_keys(tmp_path / "keys.yaml", [*ENTRIES, new])
        admit = await admitted(keyed, **bearer("new-key"))
    assert before == 401 and admit.caller == "team-new"


async def test_a_keys_decision_is_its_callers_too(keyed: Stack) -> None:
    async with asyncio.timeout(10):
        resp = await keyed.http.post(
            keyed.url + "/v1/decide",
            json={"model": MODEL, "input": "x"},
            headers=bearer("a-key", **{"x-luftpause-caller": "team-b"}),
        )
        async with resp:
            await resp.read()
    assert keyed.scheduler.admits[-1].caller == "team-a/team-b"
    assert keyed.scheduler.admits[-1].key.name == "team-a"


async def test_a_budgeted_keys_turn_is_asked_for_even_when_a_replica_is_open(
    keyed: Stack,
) -> None:
    keyed.scheduler.set_open(
        pb.OpenReplica(replica_id="engine-a", replica_url=keyed.engine_url, models=[MODEL])
    )
    async with asyncio.timeout(10):
        while not keyed.dp.link.open_for(MODEL):
            await asyncio.sleep(0.01)
        budgeted = await admitted(keyed, **bearer("a-key"))
        await keyed.post(keyed.chat(), **bearer("b-key", **{"x-luftpause-class": "batch"}))
        await keyed.scheduler.changes.until(lambda: len(keyed.scheduler.admits) == 2)
    assert budgeted.placed_replica_id == ""  # held for the scheduler's placement
    assert keyed.scheduler.admits[-1].placed_replica_id == "engine-a"  # no budget: placed here


async def test_without_keys_the_caller_header_is_taken_as_before(stack: Stack) -> None:
    async with asyncio.timeout(10):
        admit = await admitted(
            stack, **{"x-luftpause-caller": "team-b", "x-luftpause-on-behalf-of": "team-a"}
        )
    assert admit.caller == "team-b" and not admit.HasField("key")


def test_the_keys_file_comes_from_its_flag_or_its_variable() -> None:
    assert parse_args([], {}).keys_file is None
    assert parse_args([], {"LUFTPAUSE_KEYS_FILE": "/etc/k.yaml"}).keys_file == "/etc/k.yaml"
    assert parse_args(["--keys-file", "k.toml"], {"LUFTPAUSE_KEYS_FILE": "x"}).keys_file == "k.toml"


def test_a_missing_keys_file_stops_the_dataplane_at_startup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--keys-file", str(tmp_path / "nowhere.yaml")]) == 2
    assert "cannot read keys file" in capsys.readouterr().err
