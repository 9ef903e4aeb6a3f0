"""Upstream MCP tool servers: one kept-open client session each, reconnected on failure.

Shell module (network I/O through the official `mcp` client). A server is a Streamable HTTP
URL or a command line run as a child process that speaks MCP over stdio (`stdio:` names it in
the catalogue); a stdio server that exits is started again like a broken session. With tracing
on, HTTP requests carry the current span's `traceparent` header (`spans.traced_http`). Runs see
the union of the servers' tools (the first server wins a name clash) as OpenAI function tools,
and call them through `Upstreams.call`, which never raises: a failure is a failed `ToolResult`
the model reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import time
from dataclasses import dataclass
from typing import Any

import structlog
from mcp import Client
from mcp.client import Transport
from mcp.client.stdio import StdioServerParameters
from mcp.types import CallToolResult, TextContent, Tool

from luftpause.common import tracing
from luftpause.runtime import spans
from luftpause.runtime.machine import ToolCall, ToolResult

CONNECT_TIMEOUT = 10.0
TOOL_TIMEOUT = 300.0
_RECONNECT_DELAY = 0.5

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

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.tool.name,
            "description": self.tool.description or "",
            "server": self.server,
            "inputSchema": self.tool.input_schema,
            "destructive": self.destructive,
        }


class UpstreamServer:
    """One MCP server (Streamable HTTP or stdio), its session held open by a keeper task."""

    def __init__(
        self, url: str, *, stdio: bool = False, connect_timeout: float = CONNECT_TIMEOUT
    ) -> None:
        self.url = f"stdio:{url}" if stdio else url
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
                if tracing.enabled() and isinstance(target, str):
                    target = spans.traced_http(target)
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

    async def client(self) -> Client:
        """The open session, waiting for it at most `connect_timeout` s (`TimeoutError`)."""
        try:
            async with asyncio.timeout(self.connect_timeout):
                while self._client is None:
                    await self._up.wait()
        except TimeoutError:
            why = f"no session with {self.url} within {self.connect_timeout:g} s"
            raise TimeoutError(why) from None
        return self._client

    def reconnect(self) -> None:
        self._broken.set()

    async def tools(self) -> list[Tool]:
        with contextlib.suppress(TimeoutError):
            await self.client()
        return list(self._tools or [])


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

    async def call(
        self, call: ToolCall, arguments: dict[str, Any], tool: UpstreamTool
    ) -> ToolResult:
        """Call one tool; a failure becomes a failed result with the reason."""
        started = time.monotonic()
        server = next((s for s in self.servers if s.url == tool.server), None)
        if server is None:
            result: CallToolResult | str = f"no upstream server {tool.server}"
        else:
            result = await _call_reconnecting(server, call, arguments)
        if isinstance(result, str):
            content, ok = f"Error: tool {call.name} failed: {result}", False
        else:
            content, ok = result_text(result), not result.is_error
        return ToolResult(
            call_id=call.id,
            name=call.name,
            content=content,
            ok=ok,
            seconds=time.monotonic() - started,
        )


async def _call_reconnecting(
    server: UpstreamServer, call: ToolCall, arguments: dict[str, Any]
) -> CallToolResult | str:
    """The tool's result, or why it failed: a broken session is reconnected and tried once more."""
    error = ""
    for attempt in range(2):
        try:
            client = await server.client()
            return await client.call_tool(call.name, arguments)
        except Exception as exc:  # the session broke: reconnect once, then report it
            error = f"{type(exc).__name__}: {exc}"
            log.warning("upstream.call_failed", tool=call.name, attempt=attempt, error=error)
            server.reconnect()
    return error


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
