"""Child processes for tests and benchmarks: free ports, and `common.procs` re-exported.

Shell module. `Proc` and `ChildFailed` live in `luftpause.common.procs` (the product's `up`
supervises its children with them); tests and benchmarks import them from here as well.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

from luftpause.common.procs import ChildFailed, Proc, luftpause_exe

__all__ = ["ChildFailed", "Proc", "free_port", "luftpause_exe"]


# Ports are handed out below the kernel's ephemeral range. A port the kernel picks for `bind(0)`
# comes from that range, which is also where every outgoing connection takes its source port: on
# a busy machine one could take it between this check and the child's own bind, and the child
# would exit with "address in use". Each pytest-xdist worker gets its own slice, so two workers
# never hand out the same port either.
_BELOW_DEFAULT = 32768
_SPAN = 12000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _BELOW_DEFAULT


def _slice() -> range:
    """This process's ports: its xdist worker's share of the span below the ephemeral range."""
    high = _ephemeral_low()
    low = max(1024, high - _SPAN)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    size = (high - low) // count
    start = low + (index % count) * size
    return range(start, start + size)


_PORTS = _slice()
# A random start, so two runs on one machine (a test run beside a benchmark) rarely meet.
_cursor = itertools.count(random.randrange(len(_PORTS)))


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(count: int = 1) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that this process has not handed
    out lately (the first of `count` in a row, all free). It is outside the range the kernel
    gives outgoing connections, so only another listener can take it before the child binds."""
    for _ in range(len(_PORTS)):
        first = _PORTS[next(_cursor) % len(_PORTS)]
        if first + count > _PORTS.stop:
            continue
        if all(_bindable(port) for port in range(first, first + count)):
            for _ in range(count - 1):
                next(_cursor)
            return first
    raise RuntimeError(f"no {count} free ports in a row in {_PORTS.start}-{_PORTS.stop - 1}")
