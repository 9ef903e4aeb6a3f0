"""A real local stack for integration tests: two simulated engines, scheduler, dataplane."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio

from luftpause.testkit.stack import LocalStack

# Fast simulated time; two tool rounds, so a tool-using run has three turns.
ENGINE_ARGS = ("--time-scale", "20", "--tool-rounds", "2")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalStack]:
    workdir: Path = tmp_path_factory.mktemp("stack")
    async with AsyncExitStack() as exits:
        local = await LocalStack(workdir, engine_args=ENGINE_ARGS).start(exits)
        await local.wait_healthy()
        yield local
