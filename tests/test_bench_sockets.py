"""bench.sockets (`bench.router_ttfb`): another process's TCP_NODELAY, read and set from outside."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench.sockets import delayed_acks, ends_towards, nodelay, set_nodelay

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfd_getfd")

# A server that accepts one connection with Nagle on (the default), says so, then for every byte
# it reads prints the TCP_NODELAY its own socket has.
_SERVER = """
import socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
print("accepted", flush=True)
while conn.recv(1):
    print(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), flush=True)
"""


@pytest.fixture
def server() -> Iterator[tuple[subprocess.Popen[str], socket.socket]]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        port = int(proc.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            assert proc.stdout.readline() == "accepted\n"
            yield proc, client
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


def _own_flag(proc: subprocess.Popen[str], client: socket.socket) -> int:
    """The flag the server reads on its own socket (not through a duplicate)."""
    assert proc.stdout is not None
    client.sendall(b".")
    return int(proc.stdout.readline())


def test_the_client_end_towards_a_port_is_found_in_this_process(
    server: tuple[subprocess.Popen[str], socket.socket],
) -> None:
    _, client = server
    assert ends_towards(client.getpeername()[1]) == [client.getsockname()]


def test_nodelay_reads_the_servers_accepted_socket_and_setting_it_changes_the_servers_own(
    server: tuple[subprocess.Popen[str], socket.socket],
) -> None:
    proc, client = server
    end = client.getsockname()
    try:
        before = nodelay(proc.pid, [end])
    except PermissionError:
        pytest.skip("no ptrace rights over a child here")
    assert before == [0]
    assert _own_flag(proc, client) == 0
    assert set_nodelay(proc.pid, [end]) == 1
    assert nodelay(proc.pid, [end]) == [1]
    assert _own_flag(proc, client) == 1
    assert nodelay(proc.pid, [("127.0.0.1", 1)]) == []  # nobody there


def test_delayed_acks_are_read_from_the_tcpext_lines_of_netstat() -> None:
    text = (
        "TcpExt: SyncookiesSent DelayedACKs DelayedACKLocked\n"
        "TcpExt: 0 1234 5\n"
        "IpExt: InNoRoutes\nIpExt: 0\n"
    )
    assert delayed_acks(text) == 1234
    assert delayed_acks() >= 0  # this machine's own
