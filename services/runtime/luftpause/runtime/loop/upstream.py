"""Upstream MCP tool servers: one kept-open client session each, reconnected on failure.

Shell module (network I/O through the official `mcp` client). A server is a Streamable HTTP
URL or a command line run as a child process that speaks MCP over stdio (`stdio:` names it in
the catalogue); a stdio server that exits is started again like a broken session. HTTP sessions
run over `outbound.Departures`, which tells a request that never left from one that did (and,
with tracing on, sends the current span's `traceparent`); a stdio session is asked for its tools
before each call, so a child that exited since is restarted before the call goes, not during
it. Runs see the union of the servers' tools (the first server wins a name clash) as OpenAI
function tools.

`Upstreams.attempt` sends a call once and says how it went (`resend.Outcome`), never raising:
ANSWERED with the server's result (or the error it returned), NOT_SENT once the call's deadline
passed without the request ever leaving (until then a session that broke before the request
left is reconnected and the call sent), or UNKNOWN (a timeout, a session that broke after the
request was written). Whether to send it again is `resend`'s rule, applied by `toolcalls`.
Every request carries the call's idempotency key in `_meta` (`resend.META_KEY`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
from dataclasses import dataclass
from typing import Any, cast

import anyio
import structlog
from mcp import Client
from mcp.client import Transport
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent, Tool
from mcp_types import (
    CONNECTION_CLOSED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    RequestParamsMeta,
)
from pydantic import ValidationError

from luftpause.runtime.core import resend
from luftpause.runtime.core.resend import Outcome
from luftpause.runtime.loop import outbound

CONNECT_TIMEOUT = 10.0
TOOL_TIMEOUT = 300.0  # the longest wait for a call's result, resends and reconnects included
_RECONNECT_DELAY = 0.5
_NOT_SENT_PAUSE = 0.1  # between two tries of a call that did not leave, doubling up to 1 s
_CHECK_TIMEOUT = 5.0  # a stdio session's check before each call
# Errors the server returns before running anything: an answer, not an unknown outcome.
_REFUSED = frozenset({INVALID_PARAMS, METHOD_NOT_FOUND})

log = structlog.get_logger(service="runtime")


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamTool:
    server: str
    tool: Tool

    def openai(self) -> dict[str, Any]:
        """The tool as an OpenAI Chat Completions function tool."""
        schema = self.tool.input_schema or {"type": "object", "properties": {}}
        return {
            "type": "function",
            "function": {
                "name": self.tool.name,
                "description": self.tool.description or "",
                "parameters": schema,
            },
        }

    @property
    def destructive(self) -> bool:
        """The server marks the tool destructiveHint: true and not readOnlyHint: true."""
        ann = self.tool.annotations
        return bool(ann and ann.destructive_hint and not ann.read_only_hint)

    @property
    def resendable(self) -> bool:
        """The server marks the tool idempotentHint or readOnlyHint: a call whose outcome is
        unknown may be sent again (`resend`)."""
        ann = self.tool.annotations
        if ann is None:
            return False
        return resend.resendable(
            idempotent_hint=ann.idempotent_hint, read_only_hint=ann.read_only_hint
        )

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.tool.name,
            "description": self.tool.description or "",
            "server": self.server,
            "inputSchema": self.tool.input_schema,
            "destructive": self.destructive,
            "resendable": self.resendable,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """How one send of a call went: the server's result when ANSWERED, else why not."""

    outcome: Outcome
    result: CallToolResult | None = None
    why: str = ""

    def __post_init__(self) -> None:
        if (self.result is not None) != (self.outcome is Outcome.ANSWERED):
            raise ValueError("an answered attempt has a result, and only it")


class UpstreamServer:
    """One MCP server (Streamable HTTP or stdio), its session held open by a keeper task."""

    def __init__(
        self, url: str, *, stdio: bool = False, connect_timeout: float = CONNECT_TIMEOUT
    ) -> None:
        self.url = f"stdio:{url}" if stdio else url
        self.stdio = stdio
        self.connect_timeout = connect_timeout
        self._target: str | StdioServerParameters = url
        if stdio:
            command, *args = shlex.split(url)
            self._target = StdioServerParameters(command=command, args=args)
        self._client: Client | None = None
        self._up = asyncio.Event()
        self._broken = asyncio.Event()
        self._tools: list[Tool] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._keep(), name=f"upstream {self.url}")

    async def close(self) -> None:
        # A cancel that lands while the SDK's task group opens a session can come out as a
        # connection error instead of CancelledError: the flag (and a broken session) still
        # end the keeper, so closing never waits for ever.
        self._closing = True
        self._broken.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _keep(self) -> None:
        while not self._closing:
            try:
                target: str | StdioServerParameters | Transport = self._target
                if isinstance(target, str):
                    target = outbound.http_transport(target)
                async with Client(target, read_timeout_seconds=TOOL_TIMEOUT) as client:
                    self._tools = list((await client.list_tools()).tools)
                    self._client = client
                    self._up.set()
                    log.info("upstream.connected", url=self.url, tools=len(self._tools))
                    await self._broken.wait()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._closing:
                    log.warning("upstream.down", url=self.url, error=repr(exc))
            finally:
                self._client = None
                self._up.clear()
                self._broken.clear()
            if not self._closing:
                await asyncio.sleep(_RECONNECT_DELAY)

    async def client(self, timeout: float | None = None) -> Client:
        """The open session, waiting for it at most `timeout` s (default `connect_timeout`;
        `TimeoutError` saying so)."""
        wait = self.connect_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(wait):
                while self._client is None:
                    await self._up.wait()
        except TimeoutError:
            raise TimeoutError(f"no session with {self.url} within {wait:g} s") from None
        return self._client

    def reconnect(self, client: Client | None = None) -> None:
        """Drop the session (only if it is still `client`, when given) and open a new one."""
        if client is not None and client is not self._client:
            return  # a failure of a session already replaced
        self._client = None
        self._up.clear()
        self._broken.set()

    async def tools(self) -> list[Tool]:
        """The server's tools; while its session is down, the ones it listed last (a turn does
        not wait for a server that is reconnecting: a call to it waits, within its own time)."""
        if self._client is None and self._tools is not None:
            return list(self._tools)
        with contextlib.suppress(TimeoutError):
            await self.client()
        return list(self._tools or [])

    async def attempt(
        self, name: str, arguments: dict[str, Any], key: str, deadline: float
    ) -> Attempt:
        """Send one call (loop-time `deadline`); a request that did not leave is sent again on
        a new session until the deadline. Never raises but for cancellation."""
        loop = asyncio.get_running_loop()
        why, tries = f"no session with {self.url}", 0
        while (left := deadline - loop.time()) > 0:
            try:
                client = await self.client(left)
            except TimeoutError as exc:
                return Attempt(outcome=Outcome.NOT_SENT, why=str(exc))
            if self.stdio and not await self._alive(client):
                why, tries = f"the stdio server {self.url} exited", tries + 1
                continue
            try:
                result = await client.call_tool(
                    name,
                    arguments,
                    read_timeout_seconds=max(0.001, deadline - loop.time()),
                    meta=_meta(key),
                )
            except Exception as exc:  # how it failed says whether it left: `outcome`
                found = self._outcome(exc, name, client)
                if found.outcome is not Outcome.NOT_SENT:
                    return found
                why, tries = found.why, tries + 1
                await asyncio.sleep(min(_NOT_SENT_PAUSE * 2 ** (tries - 1), 1.0, max(left, 0)))
                continue
            return Attempt(outcome=Outcome.ANSWERED, result=result)
        return Attempt(outcome=Outcome.NOT_SENT, why=why)

    async def _alive(self, client: Client) -> bool:
        """Whether a stdio session is still open (a tools/list goes through, as a ping would:
        MCP 2026-07-28 has no ping); a closed one is dropped.

        Over stdio a call to a child that exited fails like one cut mid-way; asking first tells
        a session that broke before the call from one that broke during it."""
        try:
            async with asyncio.timeout(_CHECK_TIMEOUT):
                await client.list_tools(cache_mode="bypass")
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                return True
            self.reconnect(client)
            log.info("upstream.not_sent", url=self.url, error="the session is closed")
            return False
        except (TimeoutError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return True  # busy or unclear: the call itself will tell
        return True

    def _outcome(self, exc: Exception, name: str, client: Client) -> Attempt:
        """What a failed send means, the session dropped where it broke."""
        error = f"{type(exc).__name__}: {exc}"
        if outbound.not_sent(exc):
            self.reconnect(client)
            log.info("upstream.not_sent", url=self.url, tool=name, error=error)
            return Attempt(outcome=Outcome.NOT_SENT, why=str(exc))
        if isinstance(exc, MCPError) and exc.code in _REFUSED:
            text = f"Error: {exc.message}"
            return Attempt(outcome=Outcome.ANSWERED, result=_error_result(text))
        if isinstance(exc, ValidationError):  # it answered, in a shape the SDK refuses
            text = f"Error: tool {name} answered in a shape MCP does not allow: {exc}"
            return Attempt(outcome=Outcome.ANSWERED, result=_error_result(text))
        if isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT:
            log.warning("upstream.timed_out", url=self.url, tool=name)
            return Attempt(outcome=Outcome.UNKNOWN, why="no answer in time")
        log.warning("upstream.call_broken", url=self.url, tool=name, error=error)
        self.reconnect(client)
        return Attempt(outcome=Outcome.UNKNOWN, why=error)


def _meta(key: str) -> RequestParamsMeta:
    """The request's `_meta`: the call's idempotency key (an open map beside MCP's own keys)."""
    meta: dict[str, Any] = {resend.META_KEY: key}
    return cast(RequestParamsMeta, meta)


def _error_result(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(text=text)], is_error=True)


class Upstreams:
    """Every configured upstream server, as one catalogue of tools."""

    def __init__(
        self,
        urls: list[str],
        stdio: list[str] | None = None,
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self.servers = [UpstreamServer(u, connect_timeout=connect_timeout) for u in urls]
        self.servers += [
            UpstreamServer(c, stdio=True, connect_timeout=connect_timeout) for c in stdio or []
        ]

    def start(self) -> None:
        for s in self.servers:
            s.start()

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.servers))

    async def catalogue(self) -> dict[str, UpstreamTool]:
        """Tool name -> tool, over every server that answers."""
        found = await asyncio.gather(*(s.tools() for s in self.servers))
        out: dict[str, UpstreamTool] = {}
        for server, tools in zip(self.servers, found, strict=True):
            for tool in tools:
                out.setdefault(tool.name, UpstreamTool(server=server.url, tool=tool))
        return out

    async def attempt(
        self,
        tool: UpstreamTool,
        name: str,
        arguments: dict[str, Any],
        key: str,
        deadline: float,
    ) -> Attempt:
        """Send one call of `tool` (see `UpstreamServer.attempt`)."""
        server = next((s for s in self.servers if s.url == tool.server), None)
        if server is None:
            # Refused here, before anything left: a server that is not configured.
            text = f"Error: tool {name} failed: no upstream server {tool.server}"
            return Attempt(outcome=Outcome.ANSWERED, result=_error_result(text))
        return await server.attempt(name, arguments, key, deadline)


def result_text(result: CallToolResult) -> str:
    """A tool result as the text the model reads."""
    parts = []
    for item in result.content:
        if isinstance(item, TextContent):
            parts.append(item.text)
        else:
            parts.append(json.dumps(item.model_dump(mode="json", exclude_none=True)))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)
