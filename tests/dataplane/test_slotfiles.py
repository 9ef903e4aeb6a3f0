"""Saved slot context calls on one file reach the engine in the order the turns were placed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

import pytest
from multidict import CIMultiDict

from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.slotfiles import FileOrder, prepare_slot
from tests.dataplane.fakes import MemoryResponse

URL = "http://engine-a"


class GatedEngine:
    """Logs each slot call's start and end; a call named in `gates` waits until it is opened."""

    def __init__(self, *gated: tuple[str, str]) -> None:
        self.log: list[tuple[str, str, str]] = []
        self.gates = {g: asyncio.Event() for g in gated}

    async def send(self, url: str, headers: Mapping[str, str], body: bytes) -> MemoryResponse:
        call = (url.rsplit("action=", 1)[1], json.loads(body)["filename"])
        self.log.append(("start", *call))
        if call in self.gates:
            await self.gates[call].wait()
        self.log.append(("end", *call))
        return MemoryResponse(
            headers=CIMultiDict({"Content-Type": "application/json"}), chunks=[b"{}"]
        )

    async def close(self) -> None:
        return None

    def index(self, edge: str, action: str, filename: str) -> int:
        return self.log.index((edge, action, filename))


def _turn(
    engine: GatedEngine, order: FileOrder, slot: int, save: str | None, restore: str | None
) -> asyncio.Task[dict[str, bool]]:
    return asyncio.create_task(
        prepare_slot(
            engine,
            Metrics(),
            order,
            replica_id="engine-a",
            replica_url=URL,
            api_key="",
            slot=slot,
            save=save,
            restore=restore,
        )
    )


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_restore_waits_for_the_save_into_its_file_placed_before_it() -> None:
    engine, order = GatedEngine(("save", "f1")), FileOrder()
    saving = _turn(engine, order, 0, save="f1", restore=None)
    restoring = _turn(engine, order, 1, save=None, restore="f1")
    await _settle()
    assert ("start", "restore", "f1") not in engine.log  # the save is still being written
    engine.gates["save", "f1"].set()
    async with asyncio.timeout(5):
        await asyncio.gather(saving, restoring)
    assert engine.index("end", "save", "f1") < engine.index("start", "restore", "f1")
    assert len(order) == 0


async def test_a_save_waits_for_the_restore_from_its_file_placed_before_it() -> None:
    engine, order = GatedEngine(("restore", "f1")), FileOrder()
    restoring = _turn(engine, order, 0, save=None, restore="f1")
    saving = _turn(engine, order, 1, save="f1", restore=None)
    await _settle()
    assert ("start", "save", "f1") not in engine.log  # it would overwrite what is being read
    engine.gates["restore", "f1"].set()
    async with asyncio.timeout(5):
        await asyncio.gather(restoring, saving)
    assert engine.index("end", "restore", "f1") < engine.index("start", "save", "f1")


async def test_turns_that_cross_files_finish_each_in_placement_order() -> None:
    # a saves into f1 and restores from f2; b, placed after, saves into f2 and restores from f1
    engine, order = GatedEngine(), FileOrder()
    a = _turn(engine, order, 0, save="f1", restore="f2")
    b = _turn(engine, order, 1, save="f2", restore="f1")
    async with asyncio.timeout(5):
        await asyncio.gather(a, b)
    assert engine.index("end", "save", "f1") < engine.index("start", "restore", "f1")
    assert engine.index("end", "restore", "f2") < engine.index("start", "save", "f2")
    assert len(order) == 0


async def test_calls_on_other_files_do_not_wait() -> None:
    engine, order = GatedEngine(("save", "f1")), FileOrder()
    saving = _turn(engine, order, 0, save="f1", restore=None)
    other = _turn(engine, order, 1, save="f2", restore="f3")
    try:
        async with asyncio.timeout(5):
            await other
    except TimeoutError:
        pytest.fail("a turn on files f2 and f3 waited for a save into f1")
    engine.gates["save", "f1"].set()
    await saving


async def test_a_turn_cancelled_while_its_save_is_in_flight_lets_the_next_call_go() -> None:
    engine, order = GatedEngine(("save", "f1")), FileOrder()
    saving = _turn(engine, order, 0, save="f1", restore="f2")
    restoring = _turn(engine, order, 1, save=None, restore="f1")
    await _settle()
    saving.cancel()  # its client left
    async with asyncio.timeout(5):
        await restoring
    assert ("start", "restore", "f1") in engine.log
    assert ("start", "restore", "f2") not in engine.log
    assert len(order) == 0
