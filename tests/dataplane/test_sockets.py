"""TCP_NODELAY on both sides of the proxy, checked on the live sockets of this process."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import pytest

from tests.dataplane.conftest import Stack

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def nodelay_of(match: str, address: tuple[str, int]) -> list[int]:
    """TCP_NODELAY of this process's TCP sockets whose `match` name is `address`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue  # not a socket
        with sock:
            if sock.type != socket.SOCK_STREAM or sock.family != socket.AF_INET:
                continue
            try:
                name = sock.getsockname() if match == "sockname" else sock.getpeername()
            except OSError:
                continue
            if tuple(name) == tuple(address):
                found.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    return found


async def test_engine_facing_socket_has_tcp_nodelay(stack: Stack) -> None:
    async with asyncio.timeout(10):
        status, _, _ = await stack.post(stack.chat(stream=True))
    assert status == 200
    dataplane_side = stack.engine.seen[-1].peer  # the dataplane's end, as the engine saw it
    assert nodelay_of("sockname", dataplane_side) == [1]


async def test_client_facing_socket_has_tcp_nodelay(stack: Stack) -> None:
    host, port = stack.url.removeprefix("http://").split(":")
    async with asyncio.timeout(10):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /health HTTP/1.1\r\nHost: dp\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        client_end = writer.get_extra_info("sockname")
        flags = nodelay_of("peername", client_end)  # the dataplane's accepted socket
        writer.close()
        await writer.wait_closed()
    assert flags == [1]


async def test_engine_connection_is_reused_across_turns(stack: Stack) -> None:
    async with asyncio.timeout(10):
        await stack.post(stack.chat())
        await stack.post(stack.chat())
    assert stack.engine.seen[0].peer == stack.engine.seen[1].peer
