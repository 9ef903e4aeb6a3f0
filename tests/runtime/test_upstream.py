"""`upstream`: the runtime's sessions to MCP tool servers, against the fake MCP server on
127.0.0.1 (and one stdio child process); `UpstreamTool` and `result_text` without a loop.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp.types import CallToolResult, ImageContent, TextContent, Tool, ToolAnnotations

import tests.runtime.stdio_tools
from luftpause.runtime import machine as m
from luftpause.runtime.upstream import Upstreams, UpstreamTool, result_text
from luftpause.testkit.fakemcp.core import lookup_text
from tests.runtime.loopback import FakeMcp, closed_port, fake_mcp

WAIT = 10.0
STDIO_SERVER = f"{sys.executable} {Path(tests.runtime.stdio_tools.__file__).resolve()}"


def call(name: str, call_id: str = "c1") -> m.ToolCall:
    return m.ToolCall(id=call_id, name=name, arguments="{}")


def tool(annotations: ToolAnnotations | None = None) -> UpstreamTool:
    return UpstreamTool(server="s", tool=Tool(name="t", input_schema={}, annotations=annotations))


@pytest.fixture
async def fake() -> AsyncIterator[FakeMcp]:
    async with fake_mcp() as server:
        yield server


@pytest.fixture
async def upstreams(fake: FakeMcp) -> AsyncIterator[Upstreams]:
    ups = Upstreams([fake.url], connect_timeout=2.0)
    ups.start()
    yield ups
    await ups.close()


# --- without a loop ---


def test_a_tool_is_destructive_when_it_says_so_and_is_not_also_read_only() -> None:
    assert tool(ToolAnnotations(destructive_hint=True)).destructive
    both = ToolAnnotations(destructive_hint=True, read_only_hint=True)
    assert not tool(both).destructive
    assert not tool(ToolAnnotations(destructive_hint=False)).destructive
    assert not tool(None).destructive


def test_a_tool_without_a_schema_is_offered_to_the_model_with_an_empty_object_schema() -> None:
    bare = UpstreamTool(server="s", tool=Tool(name="t", input_schema={}))
    assert bare.openai()["function"]["parameters"] == {"type": "object", "properties": {}}
    assert bare.openai()["function"]["description"] == ""


def test_result_text_joins_text_and_writes_other_content_as_json() -> None:
    result = CallToolResult(
        content=[
            TextContent(text="first"),
            ImageContent(data="aGk=", mime_type="image/png"),
            TextContent(text="last"),
        ]
    )
    lines = result_text(result).split("\n")
    assert lines[0] == "first" and lines[2] == "last"
    image = json.loads(lines[1])
    assert (image["type"], image["data"]) == ("image", "aGk=") and "image/png" in image.values()


def test_result_text_falls_back_to_the_structured_content_when_there_is_no_content() -> None:
    result = CallToolResult(content=[], structured_content={"answer": 42})
    assert result_text(result) == '{"answer": 42}'
    assert result_text(CallToolResult(content=[])) == ""


# --- against real servers ---


async def test_the_catalogue_is_every_tool_of_the_server_tagged_with_its_url(
    upstreams: Upstreams, fake: FakeMcp
) -> None:
    catalogue = await upstreams.catalogue()
    assert set(catalogue) == {"lookup", "deep_search", "delete_record"}
    assert {t.server for t in catalogue.values()} == {fake.url}
    assert catalogue["delete_record"].destructive and not catalogue["lookup"].destructive
    function = catalogue["lookup"].openai()
    assert function["type"] == "function" and function["function"]["name"] == "lookup"
    assert function["function"]["parameters"]["required"] == ["query"]
    described = catalogue["deep_search"].describe()
    assert described["server"] == fake.url and "depth" in described["inputSchema"]["properties"]


async def test_a_call_returns_the_tools_text_as_an_ok_result(
    upstreams: Upstreams, fake: FakeMcp
) -> None:
    catalogue = await upstreams.catalogue()
    result = await upstreams.call(call("lookup"), {"query": "otters"}, catalogue["lookup"])
    assert (result.call_id, result.name, result.ok) == ("c1", "lookup", True)
    assert result.content == lookup_text("otters")
    assert result.seconds >= 0 and fake.stats.calls["lookup"] == 1


async def test_arguments_the_server_refuses_give_a_failed_result_saying_why(
    upstreams: Upstreams,
) -> None:
    catalogue = await upstreams.catalogue()
    deep = catalogue["deep_search"]
    result = await upstreams.call(call("deep_search"), {"query": "q", "depth": 9}, deep)
    assert not result.ok
    assert "depth" in result.content and "less than or equal to 5" in result.content
    missing = await upstreams.call(call("lookup"), {}, catalogue["lookup"])
    assert not missing.ok and "query" in missing.content


async def test_a_call_to_a_server_that_went_away_is_a_failed_result_then_it_reconnects(
    tmp_path: Path,
) -> None:
    async with fake_mcp() as first:
        ups = Upstreams([first.url], connect_timeout=0.5)
        ups.start()
        lookup = (await ups.catalogue())["lookup"]
    try:
        gone = await ups.call(call("lookup"), {"query": "q"}, lookup)
        assert not gone.ok and gone.content.startswith("Error: tool lookup failed: ")
        port = int(first.url.rsplit(":", 1)[1].split("/")[0])
        async with fake_mcp(port=port) as second, asyncio.timeout(WAIT):
            while not (back := await ups.call(call("lookup"), {"query": "q"}, lookup)).ok:
                await asyncio.sleep(0.1)
            assert back.content == lookup_text("q") and second.stats.calls["lookup"] == 1
    finally:
        await ups.close()


async def test_a_server_that_never_answers_leaves_the_catalogue_empty_and_says_so() -> None:
    url = f"http://127.0.0.1:{closed_port()}/mcp"
    ups = Upstreams([url], connect_timeout=0.2)
    ups.start()
    try:
        assert await ups.catalogue() == {}
        with pytest.raises(TimeoutError, match=f"no session with {url} within 0.2 s"):
            await ups.servers[0].client()
        somewhere = UpstreamTool(server=url, tool=Tool(name="lookup", input_schema={}))
        result = await ups.call(call("lookup"), {}, somewhere)
        assert not result.ok and f"no session with {url}" in result.content
    finally:
        await ups.close()


async def test_a_tool_of_a_server_that_is_not_configured_is_a_failed_result(
    upstreams: Upstreams,
) -> None:
    stray = UpstreamTool(server="http://elsewhere/mcp", tool=Tool(name="x", input_schema={}))
    result = await upstreams.call(call("x"), {}, stray)
    assert not result.ok
    assert result.content == "Error: tool x failed: no upstream server http://elsewhere/mcp"


async def test_the_first_server_wins_a_tool_name_both_serve(fake: FakeMcp) -> None:
    async with fake_mcp() as other:
        ups = Upstreams([other.url, fake.url], connect_timeout=2.0)
        ups.start()
        try:
            catalogue = await ups.catalogue()
            result = await ups.call(call("lookup"), {"query": "q"}, catalogue["lookup"])
        finally:
            await ups.close()
    assert catalogue["lookup"].server == other.url and result.ok
    assert (other.stats.calls["lookup"], fake.stats.calls["lookup"]) == (1, 0)


async def test_closing_at_any_moment_of_opening_a_session_returns(fake: FakeMcp) -> None:
    """A close that lands while a response is on its way inside the SDK's task group comes out
    as a connection error instead of a cancel; the keeper must stop anyway. The moment is a
    race, so the closes sweep the whole time a session takes to open: a keeper that goes round
    again hangs one of them (most runs), a correct one never does."""
    ups = Upstreams([fake.url], connect_timeout=2.0)
    ups.start()
    started = time.monotonic()
    await ups.servers[0].client()
    opening = time.monotonic() - started
    await ups.close()
    steps = 40
    for i in range(steps):
        ups = Upstreams([fake.url], connect_timeout=2.0)
        ups.start()
        await asyncio.sleep(opening * 1.2 * i / steps)
        async with asyncio.timeout(3):
            await ups.close()


async def test_a_stdio_server_runs_as_a_child_process_and_its_tools_answer() -> None:
    ups = Upstreams([], [STDIO_SERVER], connect_timeout=WAIT)
    ups.start()
    try:
        catalogue = await ups.catalogue()
        assert set(catalogue) == {"shout"}
        assert catalogue["shout"].server == f"stdio:{STDIO_SERVER}"
        result = await ups.call(call("shout"), {"text": "hi"}, catalogue["shout"])
    finally:
        await ups.close()
    assert result.ok and result.content == "SHOUTED HI"
