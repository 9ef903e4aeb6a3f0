"""The dataplane's metrics: the class alone (no sockets), then a real dataplane whose counters
and gauges move as a stream opens and ends and as its scheduler link breaks and comes back.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from luftpause.dataplane.identity import ServiceClass
from luftpause.dataplane.metrics import Metrics
from tests.dataplane.conftest import Stack, running_stack
from tests.dataplane.fakes import TEXT_STREAM, MemoryResponse, MemoryTransport

OPEN = "luftpause_dataplane_open_streams"
LINK_UP = "luftpause_dataplane_scheduler_link_up"
RECONNECTS = "luftpause_dataplane_scheduler_reconnects_total"
TTFB = "luftpause_dataplane_time_to_first_byte_seconds"
ADDED = "luftpause_dataplane_added_first_byte_seconds"


def value(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


@dataclass
class LinkView:
    ready: bool = False
    sessions: int = 0


def test_first_byte_records_the_dataplanes_share_when_given() -> None:
    metrics = Metrics()
    metrics.first_byte(ServiceClass.BATCH, 0.5, 0.002)
    metrics.first_byte(ServiceClass.BATCH, 0.25)  # a decide turn: no share measured
    batch = {"service_class": "batch"}
    assert value(metrics, TTFB + "_count", **batch) == 2
    assert value(metrics, ADDED + "_count", **batch) == 1
    assert value(metrics, ADDED + "_sum", **batch) == 0.002
    assert value(metrics, ADDED + "_bucket", le="0.0025", **batch) == 1


def test_open_streams_and_the_link_are_read_at_scrape_time() -> None:
    metrics = Metrics()
    assert value(metrics, OPEN) == 0 and value(metrics, LINK_UP) == 0
    link = LinkView(ready=True, sessions=1)
    metrics.watch_link(link)
    metrics.open_streams = 3
    assert value(metrics, OPEN) == 3
    assert value(metrics, LINK_UP) == 1 and value(metrics, RECONNECTS) == 0
    link.ready, link.sessions = False, 1
    assert value(metrics, LINK_UP) == 0
    link.ready, link.sessions = True, 3  # two breaks, each followed by a new session
    assert value(metrics, RECONNECTS) == 2


def test_the_names_dashboards_use_are_still_exported() -> None:
    text = Metrics().render().decode()
    for name in (
        "luftpause_dataplane_turns_total",
        "luftpause_dataplane_proxied_bytes_total",
        "luftpause_dataplane_time_to_first_byte_seconds",
        "luftpause_dataplane_placed_locally_total",
        "luftpause_dataplane_slot_actions_total",
    ):
        assert f"# TYPE {name} " in text, name


@dataclass
class GatedResponse(MemoryResponse):
    """An engine stream that sends its first chunk, then waits for `gate` before the rest."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def read_chunk(self) -> bytes:
        if len(self.chunks) < len(TEXT_STREAM):
            await self.gate.wait()
        return await super().read_chunk()


async def test_a_stream_is_open_while_relayed_and_its_first_byte_share_is_counted() -> None:
    gate = asyncio.Event()
    transport = MemoryTransport(lambda *_: GatedResponse(gate=gate))
    async with running_stack(lambda: transport) as stack, asyncio.timeout(10):
        metrics = stack.dp.metrics
        async with stack.http.post(
            stack.url + "/v1/chat/completions", json=stack.chat(stream=True)
        ) as resp:
            assert await resp.content.readany()  # the first chunk is through
            assert value(metrics, OPEN) == 1
            gate.set()
            await resp.read()
        await stack.turn_events(stack.scheduler.admits[-1].turn_id, 3)
    interactive = {"service_class": "interactive"}
    assert value(metrics, OPEN) == 0
    assert value(metrics, ADDED + "_count", **interactive) == 1
    # Its own share is part of the whole time to first byte.
    added = value(metrics, ADDED + "_sum", **interactive)
    assert 0 < added <= value(metrics, TTFB + "_sum", **interactive)


async def _until(stack: Stack, ready: bool) -> None:
    while stack.dp.link.ready is not ready:
        await asyncio.sleep(0.01)


async def test_the_link_gauge_follows_the_scheduler_and_a_reconnect_is_counted(
    stack: Stack,
) -> None:
    metrics = stack.dp.metrics
    assert value(metrics, LINK_UP) == 1 and value(metrics, RECONNECTS) == 0
    async with asyncio.timeout(10):
        await stack.stop_scheduler()
        await _until(stack, ready=False)
        assert value(metrics, LINK_UP) == 0
        await stack.start_scheduler()
        await _until(stack, ready=True)
    assert value(metrics, LINK_UP) == 1 and value(metrics, RECONNECTS) == 1
    text = await (await stack.http.get(stack.url + "/metrics")).text()
    assert f"{RECONNECTS} 1.0" in text
