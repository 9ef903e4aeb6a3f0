"""Child processes for tests and benchmarks: free ports, and `common.procs` re-exported.

Shell module. `Proc` and `ChildFailed` live in `luftpause.common.procs` (the product's `up`
supervises its children with them); tests and benchmarks import them from here as well.
"""

from __future__ import annotations

import socket

from luftpause.common.procs import ChildFailed, Proc, luftpause_exe

__all__ = ["ChildFailed", "Proc", "free_port", "free_ports_in_a_row", "luftpause_exe"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_ports_in_a_row(count: int, attempts: int = 50) -> int:
    """The first of `count` consecutive ports on 127.0.0.1 that were all free a moment ago."""
    for _ in range(attempts):
        first = free_port()
        socks = []
        try:
            for port in range(first, first + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return first
    raise RuntimeError(f"no {count} consecutive free ports after {attempts} tries")
