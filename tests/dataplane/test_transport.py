"""The engine transport against raw HTTP/1.1 servers that close kept-alive connections."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from luftpause.dataplane import transport as transport_module
from luftpause.dataplane.errors import EngineUnreachable
from luftpause.dataplane.transport import AiohttpTransport

REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"


async def read_request(reader: asyncio.StreamReader) -> bool:
    """Read one request (headers and a Content-Length body); False at end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return True


@asynccontextmanager
async def raw_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], object],
) -> AsyncIterator[str]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)  # type: ignore[arg-type]
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        server.close()
        await server.wait_closed()


def one_reply_per_connection(
    connections: list[int], delay: float = 0.0
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A handler that answers as if the connection stays open, then drops it as the next request
    comes in (what llama.cpp's server does to a kept-alive connection under load)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        if await read_request(reader):
            await asyncio.sleep(delay)
            writer.write(REPLY)
            await writer.drain()
            await read_request(reader)
        writer.close()

    return handle


async def test_a_kept_alive_connection_the_engine_closed_is_retried_on_a_new_one() -> None:
    connections: list[int] = []
    transport = AiohttpTransport()
    try:
        async with raw_server(one_reply_per_connection(connections)) as url:
            for _ in range(3):
                resp = await transport.send(url, {}, b'{"model": "m"}')
                assert resp.status == 200 and await resp.read() == b"{}"
    finally:
        await transport.close()
    assert len(connections) >= 3


async def test_an_engine_that_drops_every_request_is_tried_twice_then_unreachable() -> None:
    requests: list[int] = []

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await read_request(reader):
            requests.append(1)
        writer.close()

    transport = AiohttpTransport()
    try:
        async with raw_server(drop) as url:
            with pytest.raises(EngineUnreachable):
                await transport.send(url, {}, b'{"model": "m"}')
    finally:
        await transport.close()
    assert len(requests) == 2


async def test_a_refused_connection_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    async def unused(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with raw_server(unused) as url:
        pass  # closed: nothing listens on the port any more
    sockets: list[socket.socket] = []
    make = transport_module.nodelay_socket

    def counted(addr_info: tuple[Any, ...]) -> socket.socket:
        sockets.append(sock := make(addr_info))
        return sock

    # Every engine socket comes from this factory: one socket is one connection attempt.
    monkeypatch.setattr(transport_module, "nodelay_socket", counted)
    transport = AiohttpTransport()
    try:
        with pytest.raises(EngineUnreachable):
            await transport.send(url, {}, b"{}")
    finally:
        await transport.close()
    assert len(sockets) == 1


async def test_the_retry_never_takes_another_kept_alive_connection_the_engine_may_have_closed() -> (
    None
):
    # Two turns at once (each answered after 50 ms) leave two idle kept-alive connections; the
    # engine drops both as the next request comes in. The retry must go on a new connection,
    # not the other idle one.
    connections: list[int] = []
    transport = AiohttpTransport()
    try:
        async with raw_server(one_reply_per_connection(connections, delay=0.05)) as url:

            async def turn() -> None:
                resp = await transport.send(url, {}, b'{"model": "m"}')
                assert resp.status == 200 and await resp.read() == b"{}"
                resp.close()

            await asyncio.gather(turn(), turn())
            await turn()
    finally:
        await transport.close()
    assert len(connections) == 3  # two at once, then the retry's own
