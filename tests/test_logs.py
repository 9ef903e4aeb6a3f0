"""Every line a service writes is one JSON object: its own events and its libraries' records."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import logging
from luftpause.common.logs import setup_logging
from mcp.server.mcpserver.utilities.logging import configure_logging

log = setup_logging("runtime")
configure_logging("INFO")  # what the MCP SDK's server does when it is built
log.info("run.spawned", run="run-1")
logging.getLogger("uvicorn.error").info("Started server process [%d]", 42)
logging.getLogger("httpx").info("HTTP Request: POST http://127.0.0.1:1/mcp 200 OK")
logging.getLogger("httpx").warning("a warning from the HTTP client")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("uvicorn.error").exception("a failed request")
"""


def test_library_records_are_json_lines_and_the_per_request_lines_stay_out() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={"LUFTPAUSE_LOG_FORMAT": "json", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # each one JSON, or fails
    assert [(r["event"], r["service"], r["level"]) for r in lines] == [
        ("run.spawned", "runtime", "info"),
        ("Started server process [42]", "runtime", "info"),
        ("a warning from the HTTP client", "runtime", "warning"),
        ("a failed request", "runtime", "error"),
    ]
    assert "ZeroDivisionError" in lines[3]["exception"]  # the traceback as text, in the line
    assert lines[1]["logger"] == "uvicorn.error" and lines[2]["logger"] == "httpx"
    assert all("timestamp" in r for r in lines)
