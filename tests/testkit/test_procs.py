"""Ports for children and the error a child that exits early raises."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from luftpause.testkit import procs
from luftpause.testkit.procs import ChildFailed, Proc, free_port


def test_ports_come_from_below_the_range_outgoing_connections_take_theirs_from() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert all(1024 <= port < low for port in ports)
    assert len(set(ports)) == len(ports), "a port handed out twice in a row of 200"


def test_a_port_someone_listens_on_is_skipped() -> None:
    first = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        # The next port this process would hand out, taken by a listener first.
        nxt = procs._PORTS[(first - procs._PORTS.start + 1) % len(procs._PORTS)]
        try:
            held.bind(("127.0.0.1", nxt))
        except OSError:
            pytest.skip(f"{nxt} is taken already")
        held.listen()
        assert free_port() != nxt


def test_ports_in_a_row_are_all_free() -> None:
    first = free_port(3)
    for port in range(first, first + 3):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_xdist_workers_get_slices_that_do_not_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = procs._slice()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = procs._slice()
    assert first.stop <= second.start and len(first) == len(second) > 1000


async def test_a_child_that_exits_early_says_why_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    script = "import sys; print('cannot listen on 127.0.0.1:1 (port in use?)'); sys.exit(1)"
    proc = await Proc(["-c", script], name="child", log_path=log, program=[sys.executable]).start()
    with pytest.raises(ChildFailed, match=r"child exited with 1; its log ends:\n  cannot listen"):
        await proc.wait_http("http://127.0.0.1:1/health", timeout=10)
