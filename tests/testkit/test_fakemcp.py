"""The fake MCP tool server: its pure core without a loop, then the real process over loopback."""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from mcp import Client
from mcp.types import TextContent
from mcp_types import RequestParamsMeta

from luftpause.runtime.core import resend
from luftpause.testkit.fakemcp.core import (
    CallStats,
    KeyLedger,
    Latency,
    deep_search_text,
    lookup_text,
)
from luftpause.testkit.fakemcp.dedup import KEY, Dedup, read_ledger
from luftpause.testkit.fakemcp.server import (
    DEFAULT_DEEP_SEARCH_LATENCY,
    DEFAULT_LOOKUP_LATENCY,
    parse_args,
)

LUFTPAUSE = Path(sys.executable).with_name("luftpause")
STARTUP_TIMEOUT = 20.0
CALL_TIMEOUT = 10.0

# --- pure core: no event loop ---


def test_lookup_text_names_the_query_and_is_the_same_every_time() -> None:
    text = lookup_text("otter habitats")
    assert "otter habitats" in text
    assert text == lookup_text("otter habitats")
    assert text != lookup_text("beaver dams")


def test_deep_search_text_is_longer_than_lookup_and_grows_with_depth() -> None:
    shallow, deep = deep_search_text("otters", 1), deep_search_text("otters", 3)
    assert "otters" in shallow
    assert len(lookup_text("otters")) < len(shallow) < len(deep)
    assert deep.count("[depth ") == 3


def test_seeded_latencies_repeat_and_stay_in_range() -> None:
    first = [DEFAULT_LOOKUP_LATENCY.draw(random.Random("7:lookup")) for _ in range(20)]
    again = [DEFAULT_LOOKUP_LATENCY.draw(random.Random("7:lookup")) for _ in range(20)]
    assert first == again
    assert all(0.5 <= s <= 1.5 for s in first)


def test_time_scale_divides_the_latency() -> None:
    assert Latency.fixed(3.0).draw(random.Random(0), time_scale=10) == pytest.approx(0.3)


def test_latency_with_low_above_high_is_rejected() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        Latency(low=2.0, high=1.0)


def test_call_stats_count_started_calls_and_calls_in_flight() -> None:
    stats = CallStats()
    stats.started("lookup")
    stats.started("lookup")
    stats.finished("lookup")
    tools = ("lookup", "deep_search", "delete_record", "charge", "set_status")
    assert stats.snapshot() == {
        "calls": dict.fromkeys(tools, 0) | {"lookup": 2},
        "in_flight": dict.fromkeys(tools, 0) | {"lookup": 1},
    }


def test_the_key_ledger_answers_a_key_once_its_execution_finished() -> None:
    ledger = KeyLedger()
    ledger.feed({"event": "received", "key": "k", "tool": "charge"})
    ledger.feed({"event": "started", "key": "k", "tool": "charge"})
    assert ledger.answer("k") is None  # running: not yet an answer
    ledger.feed({"event": "finished", "key": "k", "tool": "charge", "result": "r"})
    ledger.feed({"event": "received", "key": "k", "tool": "charge"})
    assert ledger.answer("k") == "r"
    assert ledger.snapshot() == {
        "k": {"tool": "charge", "received": 2, "executions": 1, "answered": True}
    }
    assert ledger.executions("charge") == 1 and ledger.executions("lookup") == 0


def test_the_fake_servers_key_is_the_runtimes() -> None:
    assert KEY == resend.META_KEY


async def test_a_key_runs_once_while_a_repeat_waits_for_it_and_the_next_gets_its_result(
    tmp_path: Path,
) -> None:
    dedup = Dedup(tmp_path / "ledger.jsonl")
    gate = asyncio.Event()
    runs: list[int] = []

    async def work(n: int) -> str:
        runs.append(n)
        await gate.wait()
        return f"receipt {n}"

    first = asyncio.create_task(dedup.run("k", "charge", work))
    second = asyncio.create_task(dedup.run("k", "charge", work))
    await asyncio.sleep(0)  # both are in: one runs, one waits
    gate.set()
    async with asyncio.timeout(CALL_TIMEOUT):
        assert await first == await second == "receipt 0"
        assert await dedup.run("k", "charge", work) == "receipt 0"
        assert await dedup.run(None, "charge", work) == "receipt 0"  # no key: runs every time
    assert runs == [0, 0]
    dedup.close()
    again = read_ledger(tmp_path / "ledger.jsonl")
    assert again.snapshot()["k"] == {
        "tool": "charge",
        "received": 3,
        "executions": 1,
        "answered": True,
    }


async def test_an_execution_cut_by_the_servers_death_runs_again_after_its_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text(
        '{"event": "received", "key": "k", "tool": "charge"}\n'
        '{"event": "started", "key": "k", "tool": "charge"}\n'
        '{"event": "fini'  # torn by the kill
    )
    dedup = Dedup(path)

    async def work(n: int) -> str:
        return f"receipt {n}"

    assert await dedup.run("k", "charge", work) == "receipt 1"
    dedup.close()
    assert read_ledger(path).snapshot()["k"]["executions"] == 2


def test_arguments_fix_latencies_and_omitted_ones_keep_the_random_defaults() -> None:
    config = parse_args(["--port", "9200", "--lookup-latency", "0.01", "--time-scale", "4"])
    assert config.port == 9200
    assert config.lookup_latency == Latency.fixed(0.01)
    assert config.deep_search_latency == DEFAULT_DEEP_SEARCH_LATENCY
    assert config.time_scale == 4


def test_a_seed_gives_each_tool_its_own_repeatable_generator() -> None:
    config = parse_args(["--seed", "42"])
    assert config.rng("lookup").random() == config.rng("lookup").random()
    assert config.rng("lookup").random() != config.rng("deep_search").random()


def test_a_non_positive_time_scale_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--time-scale", "0"])
    assert exited.value.code == 2


# --- the real process on loopback, reached with the official mcp client ---


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeMcp:
    base_url: str
    process: asyncio.subprocess.Process
    log: Path

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.json()


async def _wait_until_healthy(server: FakeMcp) -> None:
    async with asyncio.timeout(STARTUP_TIMEOUT):
        while True:
            assert server.process.returncode is None, server.log.read_text()
            try:
                status, _ = await _get(f"{server.base_url}/health")
                if status == 200:
                    return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)  # poll interval, bounded by the timeout above


@pytest.fixture
async def fake_mcp(tmp_path: Path) -> AsyncIterator[FakeMcp]:
    port = _free_port()
    log = tmp_path / "fake-mcp.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            str(LUFTPAUSE), "fake-mcp", "--port", str(port),
            "--lookup-latency", "0.01", "--deep-search-latency", "0.02",
            stdout=sink, stderr=sink,
        )  # fmt: skip
    server = FakeMcp(base_url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:
        await _wait_until_healthy(server)
        yield server
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(CALL_TIMEOUT):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


def _text(result: Any) -> str:
    [block] = result.content
    assert isinstance(block, TextContent)
    return block.text


async def test_the_server_lists_its_tools_with_required_parameters(fake_mcp: FakeMcp) -> None:
    async with asyncio.timeout(CALL_TIMEOUT), Client(fake_mcp.mcp_url) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"lookup", "deep_search", "delete_record", "charge", "set_status"}
    assert tools["lookup"].input_schema["required"] == ["query"]
    assert tools["lookup"].input_schema["properties"]["query"]["type"] == "string"
    deep = tools["deep_search"].input_schema
    assert deep["required"] == ["query"]
    assert deep["properties"]["depth"]["type"] == "integer"
    assert deep["properties"]["depth"]["default"] == 2
    assert tools["delete_record"].input_schema["required"] == ["record_id"]


async def test_search_tools_are_read_only_and_delete_record_is_destructive(
    fake_mcp: FakeMcp,
) -> None:
    async with asyncio.timeout(CALL_TIMEOUT), Client(fake_mcp.mcp_url) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for name in ("lookup", "deep_search"):
        annotations = tools[name].annotations
        assert annotations is not None
        assert annotations.read_only_hint is True
    destructive = tools["delete_record"].annotations
    assert destructive is not None
    assert destructive.read_only_hint is False
    assert destructive.destructive_hint is True
    charge, status = tools["charge"].annotations, tools["set_status"].annotations
    assert charge is not None and status is not None
    assert not (charge.idempotent_hint or charge.read_only_hint or charge.destructive_hint)
    assert status.idempotent_hint is True and not status.read_only_hint


async def test_tools_answer_with_filler_text_about_the_query(fake_mcp: FakeMcp) -> None:
    async with asyncio.timeout(CALL_TIMEOUT), Client(fake_mcp.mcp_url) as client:
        looked_up = await client.call_tool("lookup", {"query": "otters"})
        searched = await client.call_tool("deep_search", {"query": "otters", "depth": 3})
        deleted = await client.call_tool("delete_record", {"record_id": "r-17"})
    assert not looked_up.is_error
    assert _text(looked_up) == lookup_text("otters")
    assert _text(searched) == deep_search_text("otters", 3)
    assert _text(deleted) == "deleted r-17"


async def test_deep_search_rejects_a_depth_outside_its_schema(fake_mcp: FakeMcp) -> None:
    async with asyncio.timeout(CALL_TIMEOUT), Client(fake_mcp.mcp_url) as client:
        result = await client.call_tool("deep_search", {"query": "otters", "depth": 9})
    assert result.is_error


async def test_stats_count_the_calls_to_each_tool(fake_mcp: FakeMcp) -> None:
    async with asyncio.timeout(CALL_TIMEOUT):
        async with Client(fake_mcp.mcp_url) as client:
            await client.call_tool("lookup", {"query": "a"})
            await client.call_tool("lookup", {"query": "b"})
            await client.call_tool("deep_search", {"query": "c"})
        status, body = await _get(f"{fake_mcp.base_url}/stats")
    assert status == 200
    assert body["calls"] == {
        "lookup": 2,
        "deep_search": 1,
        "delete_record": 0,
        "charge": 0,
        "set_status": 0,
    }
    assert set(body["in_flight"].values()) == {0}


def keyed(key: str) -> RequestParamsMeta:
    """A call's `_meta` with its idempotency key. The type is an open map (PEP 728
    `extra_items`), which mypy does not model: it would refuse the extra key."""
    return cast(RequestParamsMeta, {KEY: key})


async def test_a_charge_repeated_with_its_idempotency_key_is_executed_once(
    fake_mcp: FakeMcp,
) -> None:
    args = {"account": "acme", "cents": 5}
    async with asyncio.timeout(CALL_TIMEOUT):
        async with Client(fake_mcp.mcp_url) as client:
            first = await client.call_tool("charge", args, meta=keyed("run-1/c1"))
            again = await client.call_tool("charge", args, meta=keyed("run-1/c1"))
            other = await client.call_tool("charge", args, meta=keyed("run-1/c2"))
            bare = await client.call_tool("charge", args)
        _, body = await _get(f"{fake_mcp.base_url}/stats")
    assert _text(first) == _text(again) == "charged 5 cents to acme: receipt 0"
    assert _text(other) == "charged 5 cents to acme: receipt 1"
    assert _text(bare) == "charged 5 cents to acme: receipt 0"  # unkeyed: not numbered
    assert body["calls"]["charge"] == 3
    assert body["keys"]["run-1/c1"] == {
        "tool": "charge",
        "received": 2,
        "executions": 1,
        "answered": True,
    }
    assert body["keys"]["run-1/c2"]["executions"] == 1


async def test_clients_using_the_legacy_initialize_handshake_can_call_tools(
    fake_mcp: FakeMcp,
) -> None:
    async with asyncio.timeout(CALL_TIMEOUT), Client(fake_mcp.mcp_url, mode="legacy") as client:
        result = await client.call_tool("lookup", {"query": "otters"})
    assert _text(result) == lookup_text("otters")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_server_exits_zero_on_a_stop_signal_even_with_a_session_open(
    fake_mcp: FakeMcp, sig: signal.Signals, mode: str
) -> None:
    async with asyncio.timeout(CALL_TIMEOUT):
        async with Client(fake_mcp.mcp_url, mode=mode) as client:
            await client.call_tool("lookup", {"query": "otters"})
            # The session is still open: shutdown must not wait on it.
            fake_mcp.process.send_signal(sig)
            returncode = await fake_mcp.process.wait()
    assert returncode == 0, fake_mcp.log.read_text()
