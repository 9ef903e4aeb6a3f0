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
from typing import Any

import aiohttp
import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, ImageContent, TextContent, Tool, ToolAnnotations

import tests.runtime.stdio_tools
from luftpause.runtime.core.resend import Outcome
from luftpause.runtime.loop import outbound
from luftpause.runtime.loop.upstream import Upstreams, UpstreamTool, result_text
from luftpause.testkit.fakemcp.core import lookup_text
from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.waits import eventually
from tests.runtime.loopback import FakeMcp, closed_port, fake_mcp

WAIT = 10.0
STDIO_SERVER = f"{sys.executable} {Path(tests.runtime.stdio_tools.__file__).resolve()}"


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
    assert set(catalogue) == {"lookup", "deep_search", "delete_record", "charge", "set_status"}
    assert {t.server for t in catalogue.values()} == {fake.url}
    assert catalogue["delete_record"].destructive and not catalogue["lookup"].destructive
    function = catalogue["lookup"].openai()
    assert function["type"] == "function" and function["function"]["name"] == "lookup"
    assert function["function"]["parameters"]["required"] == ["query"]
    described = catalogue["deep_search"].describe()
    assert described["server"] == fake.url and "depth" in described["inputSchema"]["properties"]


def soon(seconds: float = WAIT) -> float:
    """A call's deadline `seconds` from now, on the loop's clock."""
    return asyncio.get_running_loop().time() + seconds


async def test_an_answered_call_carries_its_idempotency_key_to_the_server(
    upstreams: Upstreams, fake: FakeMcp
) -> None:
    lookup = (await upstreams.catalogue())["lookup"]
    done = await upstreams.attempt(lookup, "lookup", {"query": "otters"}, "run-1/c1", soon())
    assert done.outcome is Outcome.ANSWERED and done.result is not None
    assert result_text(done.result) == lookup_text("otters") and not done.result.is_error
    again = await upstreams.attempt(lookup, "lookup", {"query": "otters"}, "run-1/c1", soon())
    assert again.result is not None and result_text(again.result) == lookup_text("otters")
    assert fake.stats.calls["lookup"] == 1  # the server answered the repeat from its key


async def test_arguments_the_server_refuses_are_an_answer_saying_why(
    upstreams: Upstreams,
) -> None:
    deep = (await upstreams.catalogue())["deep_search"]
    done = await upstreams.attempt(deep, "deep_search", {"query": "q", "depth": 9}, "k", soon())
    assert done.outcome is Outcome.ANSWERED and done.result is not None and done.result.is_error
    assert "less than or equal to 5" in result_text(done.result)


async def test_a_call_to_a_server_that_went_away_is_not_sent_then_sent_once_it_is_back() -> None:
    """The server is gone before the call: the connection is refused, nothing left, so the call
    waits for a new session and goes out once the server is back, within its deadline."""
    async with fake_mcp() as first:
        ups = Upstreams([first.url], connect_timeout=0.5)
        ups.start()
        lookup = (await ups.catalogue())["lookup"]
    try:
        gone = await ups.attempt(lookup, "lookup", {"query": "q"}, "k1", soon(0.5))
        assert gone.outcome is Outcome.NOT_SENT and gone.result is None
        port = int(first.url.rsplit(":", 1)[1].split("/")[0])
        call = asyncio.create_task(ups.attempt(lookup, "lookup", {"query": "q"}, "k2", soon()))
        async with fake_mcp(port=port) as second, asyncio.timeout(WAIT):
            back = await call
            assert back.outcome is Outcome.ANSWERED
            assert second.stats.calls["lookup"] == 1
    finally:
        await ups.close()


async def test_a_call_that_gets_no_answer_in_time_has_an_unknown_outcome() -> None:
    async with fake_mcp(deep_search=WAIT) as slow:
        ups = Upstreams([slow.url], connect_timeout=2.0)
        ups.start()
        try:
            deep = (await ups.catalogue())["deep_search"]
            done = await ups.attempt(deep, "deep_search", {"query": "q"}, "k", soon(0.3))
        finally:
            await ups.close()
    assert done.outcome is Outcome.UNKNOWN and done.why == "no answer in time"


async def test_a_server_killed_mid_call_leaves_the_outcome_unknown(tmp_path: Path) -> None:
    port = free_port()
    args = ["fake-mcp", "--port", str(port), "--write-latency", "5"]
    proc = Proc(args, name="fake-mcp", log_path=tmp_path / "fake-mcp.log")
    await proc.start()
    ups = Upstreams([f"http://127.0.0.1:{port}/mcp"], connect_timeout=WAIT)
    ups.start()
    try:
        await proc.wait_http(f"http://127.0.0.1:{port}/health", WAIT)
        charge = (await ups.catalogue())["charge"]
        call = asyncio.create_task(
            ups.attempt(charge, "charge", {"account": "a", "cents": 1}, "k", soon())
        )
        await eventually(lambda: stats(port), lambda s: s["in_flight"]["charge"] == 1, "in flight")
        await proc.kill()
        async with asyncio.timeout(WAIT):
            done = await call
    finally:
        await ups.close()
        await proc.stop()
    assert done.outcome is Outcome.UNKNOWN and done.why


async def stats(port: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/stats") as resp:
        body: dict[str, Any] = await resp.json()
        return body


async def test_a_server_that_is_down_lends_the_tools_it_listed_last_without_a_wait() -> None:
    async with fake_mcp() as gone:
        ups = Upstreams([gone.url], connect_timeout=WAIT * 3)
        ups.start()
        listed = set(await ups.catalogue())
    try:
        ups.servers[0].reconnect()  # its session found broken: the keeper tries again meanwhile
        async with asyncio.timeout(WAIT):  # not the 30 s a session may take to come back
            assert set(await ups.catalogue()) == listed
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
        done = await ups.attempt(somewhere, "lookup", {}, "k", soon(0.2))
        assert done.outcome is Outcome.NOT_SENT and f"no session with {url}" in done.why
    finally:
        await ups.close()


async def test_a_tool_of_a_server_that_is_not_configured_is_refused_without_sending(
    upstreams: Upstreams,
) -> None:
    stray = UpstreamTool(server="http://elsewhere/mcp", tool=Tool(name="x", input_schema={}))
    done = await upstreams.attempt(stray, "x", {}, "k", soon())
    assert done.outcome is Outcome.ANSWERED and done.result is not None
    assert (
        result_text(done.result) == "Error: tool x failed: no upstream server http://elsewhere/mcp"
    )


async def test_the_first_server_wins_a_tool_name_both_serve(fake: FakeMcp) -> None:
    async with fake_mcp() as other:
        ups = Upstreams([other.url, fake.url], connect_timeout=2.0)
        ups.start()
        try:
            catalogue = await ups.catalogue()
            done = await ups.attempt(catalogue["lookup"], "lookup", {"query": "q"}, "k", soon())
        finally:
            await ups.close()
    assert catalogue["lookup"].server == other.url and done.outcome is Outcome.ANSWERED
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


async def test_a_stdio_server_that_exited_between_calls_is_started_again_before_the_next() -> None:
    """The call that made it exit has an unknown outcome; the next call finds the session
    closed before sending (it asks for the tools first), so it goes to a new child."""
    ups = Upstreams([], [STDIO_SERVER], connect_timeout=WAIT)
    ups.start()
    try:
        catalogue = await ups.catalogue()
        left = await ups.attempt(catalogue["leave"], "leave", {}, "k1", soon())
        done = await ups.attempt(catalogue["shout"], "shout", {"text": "hi"}, "k2", soon())
    finally:
        await ups.close()
    assert left.outcome is Outcome.UNKNOWN
    assert done.outcome is Outcome.ANSWERED and done.result is not None
    assert result_text(done.result) == "SHOUTED HI"


async def test_a_stdio_server_runs_as_a_child_process_and_its_tools_answer() -> None:
    ups = Upstreams([], [STDIO_SERVER], connect_timeout=WAIT)
    ups.start()
    try:
        catalogue = await ups.catalogue()
        assert set(catalogue) == {"shout", "leave"}
        assert catalogue["shout"].server == f"stdio:{STDIO_SERVER}"
        done = await ups.attempt(catalogue["shout"], "shout", {"text": "hi"}, "k", soon())
    finally:
        await ups.close()
    assert done.result is not None and result_text(done.result) == "SHOUTED HI"


# --- the transport that tells a request that never left ---


class Scripted(httpx2.AsyncBaseTransport):
    """An inner transport that reaches `stage` of httpcore's trace, then fails (or answers)."""

    def __init__(self, stage: str | None, answer: int | None = None) -> None:
        self.stage, self.answer = stage, answer

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        trace = request.extensions["trace"]
        await trace("connection.connect_tcp.started", {})
        if self.stage is not None:
            await trace(self.stage, {})
        if self.answer is not None:
            return httpx2.Response(self.answer, request=request)
        raise httpx2.ReadError("connection reset")


async def through(inner: Scripted, headers: dict[str, str] | None = None) -> httpx2.Response:
    transport = outbound.Departures(inner)
    request = httpx2.Request("POST", "http://tools/mcp", json={}, headers=headers)
    return await transport.handle_async_request(request)


def answer_of(response: httpx2.Response) -> MCPError:
    error = json.loads(response.content)["error"]
    return MCPError(error["code"], error["message"], error.get("data"))


async def test_a_request_that_failed_before_its_headers_left_is_answered_as_not_sent() -> None:
    response = await through(Scripted(None))
    assert response.status_code == 503
    assert outbound.not_sent(answer_of(response))
    assert "ReadError: connection reset" in answer_of(response).message


async def test_a_request_that_failed_once_its_headers_left_raises_its_error() -> None:
    with pytest.raises(httpx2.ReadError):
        await through(Scripted("http11.send_request_headers.started"))


async def test_a_404_for_the_session_a_request_names_is_answered_as_not_sent() -> None:
    sent = "http11.send_request_headers.started"
    unknown = await through(Scripted(sent, answer=404), {"mcp-session-id": "s1"})
    assert outbound.not_sent(answer_of(unknown))
    plain = await through(Scripted(sent, answer=404))  # no session named: the server's 404
    assert plain.status_code == 404


def test_only_the_transports_own_answer_counts_as_not_sent() -> None:
    assert not outbound.not_sent(MCPError(outbound.NOT_SENT, "not sent: x"))  # no marker
    assert not outbound.not_sent(MCPError(-32000, "Connection closed"))
    assert not outbound.not_sent(ValueError("x"))
