"""The real harnesses' stack: simulated engines, scheduler, two dataplanes, the MCP runtime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio

from luftpause.testkit.harnesses import HarnessStack, start_harness_stack


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[HarnessStack]:
    workdir: Path = tmp_path_factory.mktemp("harness-stack")
    async with AsyncExitStack() as exits:
        yield await start_harness_stack(exits, workdir)
