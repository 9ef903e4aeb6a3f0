"""Keys per caller with budgets of their own, end to end on real processes.

A simulated engine, `luftpause scheduler` and `luftpause dataplane` with a keys file: team-a has
a small token budget per minute, team-b none, team-c may only use batch. Driven with the official
openai client: a caller over its own budget is held while another caller's turns go on, a caller
header cannot claim another tenant, a class the key may not use is refused with 403, and a key
added to the file while the dataplane runs is taken without a restart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
import yaml
from openai import AsyncOpenAI

from luftpause.common.keys import hash_key
from luftpause.testkit.stack import LocalStack
from luftpause.testkit.status import fetch_status
from luftpause.testkit.waits import until_status

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "luftpause-sim"
KEYS = {name: f"{name}-" + "k" * 30 for name in ("team-a", "team-b", "team-c", "team-d")}
# team-a: 400 tokens a minute, a turn here some 80: five turns, then one every 12 s or so.
ENTRIES: dict[str, dict[str, Any]] = {
    "team-a": {"tokens_per_minute": 400},
    "team-b": {},
    "team-c": {"classes": ["batch"]},
}
HELLO: list[Any] = [{"role": "user", "content": "hello there"}]


@dataclass
class Keyed:
    base_url: str
    status_url: str
    keys_file: Path

    def client(self, name: str, **headers: str) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=self.base_url,
            api_key=KEYS[name],
            max_retries=0,
            timeout=60,
            default_headers=headers,
        )


def write_keys(path: Path, names: list[str]) -> None:
    entries = [{"name": n, "sha256": hash_key(KEYS[n]), **ENTRIES.get(n, {})} for n in names]
    path.write_text(yaml.safe_dump({"keys": entries}))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def keyed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Keyed]:
    work: Path = tmp_path_factory.mktemp("key-budgets")
    keys_file = work / "keys.yaml"
    write_keys(keys_file, ["team-a", "team-b", "team-c"])
    env = {"LUFTPAUSE_KEYS_FILE": str(keys_file), "LUFTPAUSE_TOKEN": ""}
    async with AsyncExitStack() as exits:
        stack = LocalStack(
            work,
            engine_args=("--time-scale", "20", "--reply-tokens", "40"),
            engines=1,
            with_dataplane=False,
        )
        await stack.start(exits)
        await stack.wait_healthy()
        dataplane = await stack.launcher.dataplane(stack.scheduler, env=env)
        yield Keyed(dataplane.base_url, stack.scheduler.status_url, keys_file)


async def ask(client: AsyncOpenAI, run: str, **extra: Any) -> float:
    """One turn; the seconds it took."""
    started = time.monotonic()
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=40,
        extra_headers={"x-luftpause-run-id": run, **extra},
    )
    assert reply.choices[0].message.content
    return time.monotonic() - started


def key_window(status: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((b for b in status["budgets"] if b["id"] == f"key:{name}"), None)


async def test_a_caller_over_its_own_budget_is_held_while_another_callers_turns_go_on(
    keyed: Keyed,
) -> None:
    """team-b's client even claims to be team-a: the header only narrows team-b's caller to
    `team-b/team-a`, so its turns are not held by team-a's budget."""
    async with (
        keyed.client("team-a", **{"x-luftpause-caller": "agent-7"}) as a,
        keyed.client("team-b", **{"x-luftpause-caller": "team-a"}) as b,
    ):
        flood = [asyncio.create_task(ask(a, f"a-{i}")) for i in range(8)]
        status = await until_status(
            keyed.status_url,
            lambda st: (key_window(st, "team-a") or {}).get("held", 0) > 0,
            "team-a's turns held for its budget",
        )
        assert {h["caller"] for h in status["held"]} == {"team-a/agent-7"}
        waits = [await ask(b, f"b-{i}") for i in range(3)]
        assert max(waits) < 5.0
        assert not all(t.done() for t in flood)
        async with asyncio.timeout(120):
            await asyncio.gather(*flood)
    status = await fetch_status(keyed.status_url)
    window = key_window(status, "team-a")
    assert window is not None and window["kind"] == "key" and window["held"] == 0
    tokens = next(d for d in window["dimensions"] if d["name"] == "tokens")
    assert tokens["limit"] == 400
    assert key_window(status, "team-b") is not None  # team-b's own, with no limit to hold by


async def test_a_class_the_key_may_not_use_is_refused_with_403(keyed: Keyed) -> None:
    async with keyed.client("team-c") as c:
        with pytest.raises(openai.PermissionDeniedError) as err:
            await ask(c, "c-1", **{"x-luftpause-class": "interactive"})
        assert "may not use class 'interactive'" in err.value.response.json()["error"]["message"]
        await ask(c, "c-2", **{"x-luftpause-class": "batch"})


async def test_a_key_added_to_the_file_while_running_is_taken(keyed: Keyed) -> None:
    async with keyed.client("team-d") as d:
        with pytest.raises(openai.AuthenticationError):
            await ask(d, "d-1")
        write_keys(keyed.keys_file, ["team-a", "team-b", "team-c", "team-d"])
        async with asyncio.timeout(10):
            while True:
                try:
                    await ask(d, "d-2")
                    break
                except openai.AuthenticationError:
                    await asyncio.sleep(0.2)
