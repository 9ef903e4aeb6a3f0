"""Fixtures shared by the runtime's in-process tests: a simulated engine that calls one tool
once and then answers (`model`), the fake MCP tool server with a slow `deep_search` (`tools`),
and a real `Runtime` over both with its journal under the test's directory (`runtime`). A module
that needs them otherwise defines its own of the same name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from luftpause.runtime.loop.runtime import Runtime
from luftpause.testkit.engine.server import RunningServer
from tests.runtime.loopback import FakeMcp, engine, fake_mcp, runtime_on


@pytest.fixture
async def model() -> AsyncIterator[RunningServer]:
    async with engine(tool_rounds=1) as server:
        yield server


@pytest.fixture
async def tools() -> AsyncIterator[FakeMcp]:
    async with fake_mcp(deep_search=5.0) as fake:
        yield fake


@pytest.fixture
async def runtime(tmp_path: Path, model: RunningServer, tools: FakeMcp) -> AsyncIterator[Runtime]:
    async with runtime_on(tmp_path, model.url, [tools.url]) as rt:
        yield rt
