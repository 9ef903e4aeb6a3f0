"""Another process's TCP sockets, from outside: read and set their TCP_NODELAY; and how many
ACKs the kernel has delayed.

Shell module, Linux only: `pidfd_getfd` (kernel 5.6+) with ptrace rights over the process (root,
or CAP_SYS_PTRACE). `bench.router_ttfb` uses it to read whether a proxy's accepted socket has
Nagle's algorithm off, and to switch it off on a proxy that does not, without changing the proxy.
The duplicated descriptor refers to the process's own socket, so a setsockopt through it changes
the socket the process writes to; closing the duplicate leaves the process's descriptor open.
`delayed_acks` is the network namespace's count of ACKs sent on the delayed-ACK timer
(`TcpExtDelayedACKs` in /proc/net/netstat), every process's connections counted.
"""

from __future__ import annotations

import ctypes
import os
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

Address = tuple[str, int]

# pidfd_getfd(2): the same number on every architecture (the unified table from 5.1 on).
_SYS_PIDFD_GETFD = 438
_libc = ctypes.CDLL(None, use_errno=True)


def _getfd(pidfd: int, fd: int) -> int:
    got: int = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pidfd_getfd: {os.strerror(err)}")
    return got


@contextmanager
def tcp_sockets(pid: int) -> Iterator[list[socket.socket]]:
    """Duplicates of the IPv4 and IPv6 TCP sockets `pid` holds now, closed on exit.
    Raises PermissionError without ptrace rights over `pid`."""
    pidfd = os.pidfd_open(pid)
    found: list[socket.socket] = []
    seen: set[str] = set()  # by inode: in this process, a listed number may be a new duplicate
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{name}")
                if not link.startswith("socket:") or link in seen:
                    continue
                dup = _getfd(pidfd, int(name))
            except PermissionError:
                raise
            except OSError:
                continue  # closed since the listing
            seen.add(link)
            sock = socket.socket(fileno=dup)
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6):
                found.append(sock)
            else:
                sock.close()
        yield found
    finally:
        for sock in found:
            sock.close()
        os.close(pidfd)


def _peer(sock: socket.socket) -> Address | None:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return None  # listening, or not connected
    return str(host), int(port)


def ends_towards(port: int, pid: int | None = None) -> list[Address]:
    """The local addresses of `pid`'s (this process's by default) TCP connections to `port`."""
    with tcp_sockets(os.getpid() if pid is None else pid) as socks:
        return sorted(
            (str(s.getsockname()[0]), int(s.getsockname()[1]))
            for s in socks
            if (peer := _peer(s)) is not None and peer[1] == port
        )


def nodelay(pid: int, peers: Iterable[Address]) -> list[int]:
    """TCP_NODELAY (0 or 1) of each of `pid`'s sockets connected to one of `peers`."""
    wanted = set(peers)
    with tcp_sockets(pid) as socks:
        return [
            int(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0)
            for s in socks
            if _peer(s) in wanted
        ]


def set_nodelay(pid: int, peers: Iterable[Address], on: bool = True) -> int:
    """TCP_NODELAY set (or cleared) on `pid`'s sockets connected to one of `peers`; how many."""
    wanted = set(peers)
    count = 0
    with tcp_sockets(pid) as socks:
        for sock in socks:
            if _peer(sock) in wanted:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(on))
                count += 1
    return count


def delayed_acks(netstat: str | None = None) -> int:
    """ACKs this network namespace has sent on the delayed-ACK timer since boot (`netstat`: the
    text of /proc/net/netstat, read when not given)."""
    text = Path("/proc/net/netstat").read_text() if netstat is None else netstat
    lines = [line.split() for line in text.splitlines() if line.startswith("TcpExt:")]
    names, values = lines[0], lines[1]
    return int(values[names.index("DelayedACKs")])
