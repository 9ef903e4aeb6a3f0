"""A process whose port is taken says so in one line and exits 1; no traceback."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from luftpause.testkit.procs import free_port, luftpause_exe


@pytest.mark.parametrize(
    "service", ["scheduler-grpc", "scheduler-http", "dataplane", "fake-engine", "runtime"]
)
def test_a_taken_port_is_one_clear_line_and_exit_1(service: str, tmp_path: Path) -> None:
    config = tmp_path / "endpoints.yaml"
    config.write_text("endpoints:\n  - id: a\n    url: http://127.0.0.1:1\n    models: [m]\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args = {
            "scheduler-grpc": [
                "scheduler",
                "--config",
                str(config),
                "--grpc-port",
                port,
                "--http-port",
                str(free_port()),
            ],
            "scheduler-http": [
                "scheduler",
                "--config",
                str(config),
                "--grpc-port",
                str(free_port()),
                "--http-port",
                port,
            ],
            "dataplane": ["dataplane", "--port", port],
            "fake-engine": ["fake-engine", "--port", port],
            "runtime": ["runtime", "--port", port, "--state-dir", str(tmp_path / "state")],
        }[service]
        done = subprocess.run(
            [luftpause_exe(), *args], capture_output=True, timeout=60, check=False
        )
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert "cannot start" in stderr and port in stderr
    assert "Traceback" not in stderr and "╭─" not in stderr
