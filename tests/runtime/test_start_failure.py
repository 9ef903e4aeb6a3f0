"""A runtime whose start fails part way closes what it had opened: its port is free again and its
upstreams and model client are closed (`main.serve`)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import structlog

from luftpause.runtime import main
from luftpause.runtime.loop.llm import Llm
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.loop.upstream import Upstreams


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_failing_resume_leaves_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []

    def failing_resume(self: Runtime, *, drive: bool = True) -> int:
        raise RuntimeError("the journal says no")

    async def upstreams_close(self: Upstreams) -> None:
        closed.append("upstreams")

    async def llm_close(self: Llm) -> None:
        closed.append("llm")

    monkeypatch.setattr(Runtime, "resume", failing_resume)
    monkeypatch.setattr(Upstreams, "close", upstreams_close)
    monkeypatch.setattr(Llm, "close", llm_close)
    port = free_port()
    config = main.parse_args(
        ["--host", "127.0.0.1", "--port", str(port), "--state-dir", str(tmp_path)], {}
    )
    log = structlog.get_logger()
    with pytest.raises(RuntimeError, match="the journal says no"):
        await main.serve(config, asyncio.Event(), log)
    assert sorted(closed) == ["llm", "upstreams"]
    with socket.create_server(("127.0.0.1", port)):  # the port is free again
        pass
