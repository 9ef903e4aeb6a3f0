"""Start, watch and stop `luftpause` subcommands as child processes (`up`, tests, benchmarks).

Shell module. Every wait is bounded; a child is only ever signalled by the PID we started.
`ChildFailed` is the one error: a child exited, or did not become ready in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import aiohttp


def luftpause_exe() -> str:
    """The `luftpause` console script beside the running interpreter."""
    return str(Path(sys.executable).with_name("luftpause"))


class ChildFailed(RuntimeError):
    """A child process exited or never became ready."""


class Proc:
    """One child process running `luftpause <args>` (or `program <args>`)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        name: str = "",
        log_path: Path | None = None,
        inherit_output: bool = False,
        own_session: bool = False,
        env: dict[str, str] | None = None,
        program: Sequence[str] | None = None,
    ) -> None:
        # `program` runs something other than `luftpause` (a peer such as sglang-router).
        self.args = [*(program or [luftpause_exe()]), *args]
        self.name = name or args[0]
        self.log_path = log_path
        self.inherit_output = inherit_output
        # In its own session a child does not get the terminal's Ctrl-C; its parent stops it.
        self.own_session = own_session
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> Proc:
        # A log file opened for a child's lifetime; the open is instant on a local disk.
        out: int | BinaryIO | None = asyncio.subprocess.DEVNULL
        if self.inherit_output:
            out = None
        elif self.log_path:
            out = open(self.log_path, "ab")  # noqa: SIM115, ASYNC230
        env = {**os.environ, **(self.env or {})}
        if not self.inherit_output:
            env.setdefault("LUFTPAUSE_LOG_FORMAT", "json")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args,
                stdout=out,
                stderr=out,
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
                start_new_session=self.own_session,
            )
        finally:
            if out is not None and not isinstance(out, int):
                out.close()
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def wait_http(self, url: str, timeout: float = 20.0) -> None:
        """Poll `url` until it answers 2xx; fail early if the child exits."""
        async with aiohttp.ClientSession() as session:
            try:
                async with asyncio.timeout(timeout):
                    while True:
                        if not self.running:
                            raise self._exited()
                        with contextlib.suppress(aiohttp.ClientError, OSError):
                            async with session.get(url) as resp:
                                if resp.status < 300:
                                    return
                        await asyncio.sleep(0.05)
            except TimeoutError as exc:
                raise ChildFailed(f"{self.name} not ready at {url} after {timeout}s") from exc

    async def wait_port(self, port: int, timeout: float = 20.0) -> None:
        """Wait until something accepts TCP connections on 127.0.0.1:`port`."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if not self.running:
                        raise self._exited()
                    try:
                        _, writer = await asyncio.open_connection("127.0.0.1", port)
                    except OSError:
                        await asyncio.sleep(0.05)
                        continue
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
                    return
        except TimeoutError as exc:
            raise ChildFailed(f"{self.name} not listening on {port} after {timeout}s") from exc

    def _exited(self) -> ChildFailed:
        return ChildFailed(f"{self.name} exited with {self._code()}{self._log_tail()}")

    def _log_tail(self, lines: int = 12) -> str:
        """The end of the child's log, to say why it exited (empty when it has none)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
                tail = f.read().decode(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        if not tail:
            return ""
        return "; its log ends:" + "".join(f"\n  {line}" for line in tail)

    def _code(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
        if self.proc is None or self.proc.returncode is not None:
            return self._code()
        self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(timeout):
                return await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            return await self.proc.wait()

    async def kill(self) -> None:
        """SIGKILL at once (a crash, for failure tests)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
