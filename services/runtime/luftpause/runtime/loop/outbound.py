"""The HTTP transport under the upstream MCP sessions: it tells a request that never left from
one that did, so a tool call that never reached its server can be sent again safely
(`resend`'s NOT_SENT).

Shell module (httpx2, the HTTP client the `mcp` SDK uses). `Departures` wraps the SDK's
transport and watches each request through httpcore's `trace` extension. A request that fails
before its headers began to go out (the connection was refused, the connect timed out, no
connection was free), or that the server answered 404 for the session it names (a Streamable
HTTP server MUST refuse a session it does not know with 404, without running the request), is
answered by the transport itself: 503 with a JSON-RPC error of code `NOT_SENT` whose data says
`{"notSent": true}`. The SDK hands that error to the call's waiter as any server error, and
`not_sent` recognises it. A failure once the headers began is raised as httpx2 raises it: the
server may have the request, so its outcome is unknown.

With tracing on, every request also carries the current span's `traceparent` (`spans`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx2
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from luftpause.common import tracing

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams

NOT_SENT = -32090  # JSON-RPC implementation-defined server error range
_SESSION_HEADER = "mcp-session-id"
# The transport's own timeouts: connecting and writing are short; reading is left to each
# call's deadline (an SSE stream may be quiet for as long as a tool takes).
_TIMEOUT = httpx2.Timeout(10.0, read=None)


class Departures(httpx2.AsyncBaseTransport):
    """An httpx2 transport that answers for requests that never left (module docstring)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        left = False
        outer = request.extensions.get("trace")

        async def trace(name: str, info: dict[str, Any]) -> None:
            nonlocal left
            if name.endswith(".send_request_headers.started"):
                left = True
            if outer is not None:
                await outer(name, info)

        request.extensions = {**request.extensions, "trace": trace}
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.TransportError as exc:
            if left:
                raise
            return _not_sent(request, f"{type(exc).__name__}: {exc}".rstrip(": "))
        if response.status_code == 404 and _SESSION_HEADER in request.headers:
            await response.aclose()
            return _not_sent(request, "the server does not know the session (404)")
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _not_sent(request: httpx2.Request, why: str) -> httpx2.Response:
    body = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": NOT_SENT, "message": f"not sent: {why}", "data": {"notSent": True}},
    }
    return httpx2.Response(
        503,
        headers={"content-type": "application/json"},
        content=json.dumps(body).encode(),
        request=request,
    )


def not_sent(exc: BaseException) -> bool:
    """The error is `Departures`' answer for a request that never left."""
    if not isinstance(exc, MCPError) or exc.error.code != NOT_SENT:
        return False
    data = exc.error.data
    return isinstance(data, dict) and data.get("notSent") is True


async def _inject(request: httpx2.Request) -> None:
    tracing.inject(request.headers)


@asynccontextmanager
async def http_transport(url: str) -> AsyncIterator[TransportStreams]:
    """The SDK's Streamable HTTP transport to `url` over `Departures` (and, with tracing on,
    every request carrying the current span's `traceparent`)."""
    hooks: dict[str, list[Any]] = {"request": [_inject]} if tracing.enabled() else {}
    async with (
        httpx2.AsyncClient(timeout=_TIMEOUT, transport=Departures(), event_hooks=hooks) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams
