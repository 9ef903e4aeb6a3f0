"""How the dataplane reaches engines: a small interface and its aiohttp implementation.

Boundary module. The proxy depends only on the `EngineTransport` / `EngineResponse` protocols,
so tests can put an in-memory engine behind them (as httpx's `MockTransport` does). The aiohttp
implementation keeps one `ClientSession` per process with a keep-alive pool (and one without,
for the retry after a dropped kept-alive connection), sets TCP_NODELAY on every engine socket,
and maps aiohttp's errors to `EngineUnreachable` (before response headers) and
`EngineStreamBroken` (after) at this boundary.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from typing import Any, Protocol

import aiohttp

from luftpause.dataplane.errors import EngineStreamBroken, EngineUnreachable

CONNECT_TIMEOUT_SECONDS = 2.0
# uvicorn (vLLM, SGLang) drops idle keep-alive connections after 5 s: let ours go first, so a
# turn is never sent on a connection the engine is closing.
KEEPALIVE_SECONDS = 4.0

_TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError)
# A kept-alive connection the engine closed under us: disconnected, or the write failed.
_STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


class EngineResponse(Protocol):
    """An engine's reply whose headers have arrived; the body is read on demand."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read_chunk(self) -> bytes:
        """The next bytes of the body as they arrive; b"" at its end."""
        ...

    async def read(self) -> bytes:
        """The rest of the body."""
        ...

    def close(self) -> None:
        """Release the connection; one whose body was not read to its end is closed."""
        ...


class EngineTransport(Protocol):
    """Sends one chat completion request to an engine."""

    async def send(self, url: str, headers: Mapping[str, str], body: bytes) -> EngineResponse:
        """POST `body` to `url`; returns once response headers arrive."""
        ...

    async def close(self) -> None: ...


def describe(exc: BaseException) -> str:
    """A one-line description of a transport error for the client's error message."""
    text = str(exc).strip()
    return text if text else type(exc).__name__


def nodelay_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """Socket factory for the connector: TCP_NODELAY before connect, so no small write waits.

    aiohttp also sets the option once connected; setting it here does not depend on that.
    """
    family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family=family, type=type_, proto=proto)
    if family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class AiohttpEngineResponse:
    """`EngineResponse` over an aiohttp `ClientResponse`."""

    __slots__ = ("_resp",)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    async def read_chunk(self) -> bytes:
        try:
            return await self._resp.content.readany()
        except _TRANSPORT_ERRORS as exc:
            raise EngineStreamBroken(describe(exc)) from exc

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except _TRANSPORT_ERRORS as exc:
            raise EngineStreamBroken(describe(exc)) from exc

    def close(self) -> None:
        # After the body's end aiohttp has already returned the connection to the pool; before
        # it, close() closes the socket, which is what stops the engine generating.
        self._resp.close()


class AiohttpTransport:
    """`EngineTransport` over one pooled aiohttp `ClientSession`."""

    def __init__(self, connect_timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
        connector = aiohttp.TCPConnector(
            limit=0,
            keepalive_timeout=KEEPALIVE_SECONDS,
            socket_factory=nodelay_socket,
        )
        self._session = _session(connector)
        # For the one retry after a dropped kept-alive connection: a connection of its own,
        # closed after the reply. The pool may hold other idle connections the engine dropped
        # at the same moment (llama.cpp closes them together under load).
        self._fresh = _session(
            aiohttp.TCPConnector(limit=0, force_close=True, socket_factory=nodelay_socket)
        )
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout)

    async def send(self, url: str, headers: Mapping[str, str], body: bytes) -> EngineResponse:
        try:
            try:
                resp = await self._post(url, headers, body)
            except _STALE_CONNECTION as exc:
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise  # nothing listens: no second try
                # The engine closed a kept-alive connection as we reused it (llama.cpp's HTTP
                # server does this under load): no reply byte came back, so try once more on a
                # new connection. An engine that read the turn and died answers the second try
                # with a refused connection, so a turn runs twice only if the engine drops
                # connections after reading them and then comes back.
                resp = await self._post(url, headers, body, fresh=True)
        except _TRANSPORT_ERRORS as exc:
            raise EngineUnreachable(describe(exc)) from exc
        return AiohttpEngineResponse(resp)

    async def _post(
        self, url: str, headers: Mapping[str, str], body: bytes, *, fresh: bool = False
    ) -> aiohttp.ClientResponse:
        session = self._fresh if fresh else self._session
        return await session.post(
            url, data=body, headers=headers, timeout=self._timeout, allow_redirects=False
        )

    async def close(self) -> None:
        await self._session.close()
        await self._fresh.close()


def _session(connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )
