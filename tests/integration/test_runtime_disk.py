"""The runtime's journal on a disk that fills up: a real `luftpause runtime` whose state dir is a
512 KiB tmpfs of its own (a mount namespace, `unshare -Urm`), filled by the test while two runs
have their tool calls out. New spawns are refused with the reason, the runs wait at their next
record, nothing half-written stays behind, and once there is room again everything goes on.
"""

from __future__ import annotations

import asyncio
import errno
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client

from luftpause.runtime.core import forks
from luftpause.runtime.core import journal as j
from luftpause.testkit.fakemcp.dedup import read_ledger
from luftpause.testkit.procs import Proc, free_port, luftpause_exe
from luftpause.testkit.stack import Launcher, LocalStack
from luftpause.testkit.waits import READY_SECONDS, WAIT_SECONDS, eventually, local_url

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The runtime's own mount of a small tmpfs over its state dir, then the runtime itself.
MOUNT = 'mount -t tmpfs -o size=512k luftpause-test "$1" && shift && exec "$@"'


def _namespaces() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = [unshare, "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k t /mnt"]
    return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0


needs_namespaces = pytest.mark.skipif(
    not _namespaces(), reason="needs user and mount namespaces (unshare -Urm) for a small tmpfs"
)


class Disk:
    """The runtime's state dir as seen inside its mount namespace."""

    def __init__(self, proc: Proc, state: Path) -> None:
        self.root = Path(f"/proc/{proc.pid}/root") / state.relative_to("/")
        self.ballast = self.root / "ballast"

    def fill(self) -> int:
        """Write the tmpfs full; the bytes it took."""
        written = 0
        chunk = b"\0" * 4096
        with self.ballast.open("wb", buffering=0) as f:
            try:
                while True:
                    written += f.write(chunk) or 0
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        return written

    def free(self) -> None:
        self.ballast.unlink()

    def records(self) -> tuple[list[dict[str, Any]], j.JournalDecoder]:
        decoder = j.JournalDecoder()
        data = (self.root / "runs.jsonl").read_bytes()
        return list(forks.expand(decoder.feed(data) + decoder.flush())), decoder


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    workdir: Path = tmp_path_factory.mktemp("disk")
    async with AsyncExitStack() as exits:
        stack = await LocalStack(workdir, engine_args=("--time-scale", "50"), engines=1).start(
            exits
        )
        await stack.wait_healthy()
        launcher = Launcher(workdir, exits)
        tools_port, port = free_port(), free_port()
        ledger = workdir / "tools.ledger"
        tools_args = ["fake-mcp", "--port", str(tools_port), "--ledger", str(ledger)]
        await launcher.spawn(
            "tools", [*tools_args, "--write-latency", "1.5"], local_url(tools_port) + "/health"
        )
        state = workdir / "state"
        state.mkdir()
        args = ["runtime", "--port", str(port), "--state-dir", str(state)]
        args += ["--dataplane", local_url(stack.dataplane_port)]
        args += ["--mcp-server", local_url(tools_port) + "/mcp"]
        program = ["unshare", "-Urm", "sh", "-c", MOUNT, "sh", str(state), luftpause_exe()]
        runtime = Proc(args, name="runtime", log_path=workdir / "runtime.log", program=program)
        await runtime.start()
        exits.push_async_callback(runtime.stop)
        await runtime.wait_http(local_url(port) + "/health", READY_SECONDS)
        yield {"url": local_url(port), "disk": Disk(runtime, state), "ledger": ledger}


async def call(url: str, tool: str, args: dict[str, Any]) -> Any:
    async with asyncio.timeout(WAIT_SECONDS + 5), Client(url + "/mcp") as c:
        return await c.call_tool(tool, args)


async def spawn(url: str, tool: str) -> str:
    result = await call(url, "spawn", {"task": f"use {tool}", "tools": [tool], "maxToolCalls": 1})
    assert not result.is_error, result.content
    return str(result.structured_content["handle"])


async def get(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        return await (resp.json() if url.endswith("/status") else resp.text())


@needs_namespaces
async def test_a_full_disk_refuses_spawns_holds_runs_at_their_record_and_loses_nothing(
    setup: dict[str, Any],
) -> None:
    url, disk, ledger = setup["url"], setup["disk"], setup["ledger"]
    runs = [await spawn(url, "charge"), await spawn(url, "set_status")]

    def keys() -> dict[str, Any]:
        counts = read_ledger(ledger).snapshot()
        return {k: v for k, v in counts.items() if k.split("/")[0] in runs}

    async def probe() -> dict[str, Any]:
        return keys()

    await eventually(probe, lambda k: len(k) == 2, "both calls at the tool server")
    assert disk.fill() > 0

    # The journal's last page may still take a record or two: spawn until it is full.
    extra: list[str] = []
    for _ in range(20):
        refused = await call(url, "spawn", {"task": "one more", "maxToolCalls": 0})
        if refused.is_error:
            break
        extra.append(refused.structured_content["handle"])
    assert refused.is_error, f"{len(extra)} spawns went in"
    [text] = [c.text for c in refused.content if hasattr(c, "text")]
    assert "cannot write its journal (runs.jsonl: No space left on device)" in text
    assert "new runs are refused until it can" in text

    # The calls answer; their results wait for the disk, and the runs wait with them.
    await eventually(probe, lambda k: all(v["answered"] for v in k.values()), "both answered")

    async def status() -> Any:
        return await get(url + "/status")

    held = await eventually(status, lambda s: not s["journal"]["writable"], "journal unwritable")
    assert held["journal"]["error"] == "runs.jsonl: No space left on device"
    metrics = await get(url + "/metrics")
    assert 'luftpause_runtime_journal_write_failures_total{errno="28"}' in metrics
    # Each round is complete in memory, its record waiting: no next turn has begun.
    summaries = (await call(url, "status", {"handles": runs})).structured_content["runs"]
    assert [(s["state"], s["turns"]) for s in summaries] == [("running", 1), ("running", 1)]

    disk.free()
    done = await call(url, "await", {"handles": [*runs, *extra], "timeout": WAIT_SECONDS})
    assert {r["state"] for r in done.structured_content["runs"]} == {"finished"}
    assert all(r["failedToolCalls"] == 0 for r in done.structured_content["runs"])
    later = await spawn(url, "set_status")
    again = await call(url, "await", {"handles": [later], "timeout": WAIT_SECONDS})
    assert again.structured_content["runs"][0]["state"] == "finished"
    assert (await status())["journal"] == {"writable": True}

    records, decoder = disk.records()
    assert decoder.skipped == 0 and decoder.torn == 0  # no half-written record anywhere
    for handle in [*runs, later]:
        mine = [r["type"] for r in records if r["run"] == handle]
        assert mine == ["spawned", "turn", "call", "round", "finished"], mine
    for handle in extra:  # no tools: a turn, its answer
        assert [r["type"] for r in records if r["run"] == handle] == ["spawned", "finished"]
    assert all(v["executions"] == 1 and v["received"] == 1 for v in keys().values())
