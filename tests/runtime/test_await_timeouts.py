"""`await` and `run` wait 60 s unless told otherwise and refuse more than 600 s: the runtime's MCP
server in-process (the official client's in-memory connection, no sockets) over a stand-in for
`Runtime` that records how long it was asked to wait instead of waiting.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from mcp import Client

from luftpause.runtime.core import machine as m
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.people.question_gate import Questions
from luftpause.runtime.server.app import build_server
from luftpause.runtime.server.arguments import AWAIT_DEFAULT, AWAIT_MAX

HANDLE = "run-0"


@dataclass
class Recording:
    """What the server asks of a Runtime for await and run: waits are recorded, never made."""

    waits: list[tuple[list[str], str, float]] = field(default_factory=list)
    runs: dict[str, Any] = field(default_factory=lambda: {HANDLE: object()})
    questions: Questions = field(default_factory=Questions)

    async def spawn(self, spec: m.RunSpec) -> str:
        self.runs[spec.handle] = object()
        return spec.handle

    async def known(self, handles: list[str]) -> None:
        """One process's journal: nothing to catch up with."""

    async def await_runs(
        self,
        handles: list[str],
        mode: str,
        timeout: float,
        *,
        interrupt: asyncio.Event | None = None,
    ) -> list[dict[str, Any]]:
        self.waits.append((handles, mode, timeout))
        return [{"handle": h, "state": "finished"} for h in handles]


def client(recording: Recording, mode: str) -> Client:
    return Client(build_server(cast(Runtime, recording), default_model="m"), mode=mode)


MODES = pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])


def test_the_constants_are_the_documented_60_and_600_seconds() -> None:
    assert (AWAIT_DEFAULT, AWAIT_MAX) == (60.0, 600.0)


@MODES
async def test_await_and_run_wait_60_seconds_when_no_timeout_is_given(mode: str) -> None:
    recording = Recording()
    async with client(recording, mode) as c:
        waited = await c.call_tool("await", {"handles": [HANDLE]})
        ran = await c.call_tool("run", {"task": "t"})
    assert not waited.is_error and not ran.is_error
    [(handles, how, timeout), (_, run_how, run_timeout)] = recording.waits
    assert (handles, how, timeout) == ([HANDLE], "all", 60.0)
    assert (run_how, run_timeout) == ("all", 60.0)


@MODES
async def test_await_and_run_take_any_timeout_from_0_to_600_seconds(mode: str) -> None:
    recording = Recording()
    async with client(recording, mode) as c:
        for seconds in (0, 0.25, 600):
            await c.call_tool("await", {"handles": [HANDLE], "mode": "any", "timeout": seconds})
        await c.call_tool("run", {"task": "t", "timeout": 600})
    assert [(how, t) for _, how, t in recording.waits] == [
        ("any", 0.0),
        ("any", 0.25),
        ("any", 600.0),
        ("all", 600.0),
    ]


@MODES
async def test_a_timeout_above_600_seconds_or_below_0_is_refused_before_any_wait(
    mode: str,
) -> None:
    recording = Recording()
    async with client(recording, mode) as c:
        refused = [
            await c.call_tool("await", {"handles": [HANDLE], "timeout": seconds})
            for seconds in (600.5, 3600, -1)
        ]
        refused.append(await c.call_tool("run", {"task": "t", "timeout": 601}))
    assert all(r.is_error for r in refused)
    assert "600" in str(refused[0].content) and "0" in str(refused[2].content)
    assert recording.waits == [] and list(recording.runs) == [HANDLE]  # nothing spawned either


async def test_the_tool_schemas_tell_clients_the_default_and_the_maximum() -> None:
    async with client(Recording(), "legacy") as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    for name in ("await", "run"):
        timeout = tools[name].input_schema["properties"]["timeout"]
        assert (timeout["default"], timeout["maximum"], timeout["minimum"]) == (60.0, 600.0, 0)
