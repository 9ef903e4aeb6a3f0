"""The scheduler's status page in real headless Chromium: it renders and follows the state,
and shows a runtime's run tree (a real runtime process replaying a journal written here).

Chromium is driven over the Chrome DevTools Protocol with aiohttp's websocket client, so no
browser-automation package is needed; `make install` installs Debian's `chromium`. The scheduler
and its stub engines come from the `stack` fixture of test_scheduler_process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from luftpause.runtime.core import journal
from luftpause.runtime.core import machine as m
from luftpause.testkit.procs import Proc, free_port
from tests.scheduler import test_scheduler_process as sched

stack = sched.stack

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
)

# One row per replica: every cell's text, and the class that colours the health cell.
NO_KV = "\u2013"  # the page's dash for a replica whose KV pool is unknown
REPLICA_ROWS = """Array.from(document.querySelectorAll("#replicas tbody tr"), tr => ({
  cells: Array.from(tr.cells, td => td.textContent), health_class: tr.cells[1].className}))"""
TABLE_HEADS = """Object.fromEntries(Array.from(document.querySelectorAll("table"),
  t => [t.id, Array.from(t.tHead.rows[0].cells, th => th.textContent)]))"""
RUN_PHASES = (
    """Array.from(document.querySelectorAll("#runs tbody tr"), tr => tr.cells[0].textContent)"""
)


class DevToolsError(RuntimeError):
    """Chromium answered a DevTools command with an error, or went away."""


class DevTools:
    """Commands over one DevTools websocket; a reply is matched to its command by id."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(
        self, method: str, session: str | None = None, timeout: float = 10.0, **params: Any
    ) -> dict[str, Any]:
        """Send one command (to a page when `session` is given) and return its result."""
        msg_id = next(self._ids)
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        async with asyncio.timeout(timeout):
            await self._ws.send_json(message)
            # Events arriving in between are not needed by these tests; they are dropped.
            async for frame in self._ws:
                if frame.type is not aiohttp.WSMsgType.TEXT:
                    break
                reply = json.loads(frame.data)
                if reply.get("id") != msg_id:
                    continue
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result
        raise DevToolsError(f"{method}: the DevTools websocket closed")


@dataclass
class Page:
    """One browser tab, attached to the browser's websocket by a flat session."""

    devtools: DevTools
    session: str

    @classmethod
    async def open(cls, devtools: DevTools, url: str) -> Page:
        target = await devtools.call("Target.createTarget", url="about:blank")
        attached = await devtools.call(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        page = cls(devtools, attached["sessionId"])
        await page.call(
            "Emulation.setDeviceMetricsOverride",
            width=1100,
            height=640,
            deviceScaleFactor=1,
            mobile=False,
        )
        navigated = await page.call("Page.navigate", url=url)
        assert "errorText" not in navigated, navigated
        return page

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command to this tab."""
        return await self.devtools.call(method, self.session, **params)

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of `expression` evaluated in the page."""
        answer = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise DevToolsError(f"{expression!r} threw {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def until(
        self, expression: str, predicate: Callable[[Any], bool], timeout: float = 10.0
    ) -> Any:
        """Evaluate `expression` until its value satisfies `predicate`; return that value."""
        value = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    value = await self.evaluate(expression)
                    if predicate(value):
                        return value
                    await asyncio.sleep(0.05)
        except TimeoutError:
            pytest.fail(f"the page did not get there in {timeout}s; it last showed {value!r}")

    async def screenshot(self, path: Path) -> None:
        """Save what the tab shows as a PNG."""
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))


async def _devtools_url(proc: asyncio.subprocess.Process, profile: Path, log: Path) -> str:
    """The browser's websocket URL, from the DevToolsActivePort file Chromium writes at start."""
    active = profile / "DevToolsActivePort"
    try:
        async with asyncio.timeout(20):
            while True:
                if proc.returncode is not None:
                    pytest.fail(f"chromium exited with {proc.returncode}; see {log}")
                lines = active.read_text().split() if active.exists() else []
                if len(lines) == 2:
                    port, path = lines
                    return f"ws://127.0.0.1:{port}{path}"
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"chromium opened no DevTools port in 20s; see {log}")


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the browser's process group (it leads it); SIGKILL whatever is left of it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10):
            await proc.wait()
    # A helper still shutting down, or the browser itself if SIGTERM was not enough.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


@pytest.fixture
async def chromium(tmp_path: Path) -> AsyncIterator[DevTools]:
    """A headless Chromium of our own; teardown ends it and its helpers by its PID."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: `make install` installs Debian's chromium")
    profile, log = tmp_path / "chromium-profile", tmp_path / "chromium.log"
    profile.mkdir()
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # its helper processes share its group, so teardown ends them
        )
    try:
        url = await _devtools_url(proc, profile, log)
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(10):
                ws = await http.ws_connect(url, max_msg_size=0)
            async with ws:
                yield DevTools(ws)
    finally:
        await _stop(proc)


async def test_status_page_shows_replicas_and_follows_a_replica_going_down(
    stack: sched.Stack, chromium: DevTools, tmp_path: Path
) -> None:
    page = await Page.open(chromium, stack.http + "/")

    def rows_by_id(rows: list[dict[str, Any]]) -> dict[str, str]:
        return {r["cells"][0]: r["cells"][1] for r in rows}

    rows = await page.until(REPLICA_ROWS, lambda v: rows_by_id(v) == {"a": "up", "b": "up"})
    assert [r["cells"] for r in rows] == [
        [rid, "up", "0 (0) / uncapped, open", "0 / 0", "0", NO_KV, sched.MODEL]
        for rid in ("a", "b")
    ]
    assert [r["health_class"] for r in rows] == ["up", "up"]
    assert (await page.evaluate('document.getElementById("updated").textContent')).startswith(
        "updated "
    )
    heads = await page.evaluate(TABLE_HEADS)
    assert heads["held"] == ["class", "caller", "count", "oldest wait (s)"]
    assert heads["runs"] == ["phase", "interactive", "batch"]
    assert heads["budgets"][:4] == ["window", "kind", "replicas", "regime"]
    assert await page.evaluate(RUN_PHASES) == list((await stack.status())["runs"])
    await page.evaluate("window.loadedOnce = true")

    stack.engines["b"].healthy = False
    rows = await page.until(REPLICA_ROWS, lambda v: rows_by_id(v) == {"a": "up", "b": "down"})
    assert [r["health_class"] for r in rows] == ["up", "down"]
    assert [r["cells"][2] for r in rows] == ["0 (0) / uncapped, open", "0 (0) / uncapped"]
    assert await page.evaluate("window.loadedOnce") is True  # the same document, never reloaded
    stack.engines["a"].kv_total = 50_000  # its engine now says how much KV it has
    rows = await page.until(REPLICA_ROWS, lambda v: v[0]["cells"][5] != NO_KV)
    assert rows[0]["cells"][5] == "0 / 50000 (0 runs)"
    await page.screenshot(tmp_path / "status_page.png")
    assert (tmp_path / "status_page.png").read_bytes().startswith(b"\x89PNG")


# The run tree's rows: each run's handle and depth, and every cell's text.
TREE_ROWS = """Array.from(document.querySelectorAll("#run-tree tbody tr"), tr => ({
  handle: tr.dataset.handle, depth: Number(tr.dataset.depth),
  cells: Array.from(tr.cells, td => td.textContent)}))"""


def _write_journal(state_dir: Path) -> None:
    """A finished parent run with a finished child that made one tool call: nothing resumes."""
    parent = m.RunSpec(handle="run-parent", task="plan the trip", model="sim", caller="test")
    child = m.RunSpec(
        handle="run-child",
        task="find trains",
        model="sim",
        service_class="batch",
        parent="run-parent",
        caller="test",
    )
    lookup = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    records = [
        journal.spawned_record(parent),
        journal.spawned_record(child),
        journal.round_record(
            "run-child",
            m.RecordRound(
                round=1,
                assistant={"role": "assistant", "content": None, "tool_calls": [lookup]},
                results=(m.ToolResult(call_id="c1", name="lookup", content="a train"),),
                usage=m.Usage(turns=1, prompt_tokens=100, completion_tokens=10),
            ),
        ),
        journal.finished_record(
            "run-child",
            m.RecordFinished(
                phase=m.Phase.FINISHED,
                result="the 9:10",
                error=None,
                usage=m.Usage(turns=1, prompt_tokens=120, completion_tokens=5),
            ),
        ),
        journal.finished_record(
            "run-parent",
            m.RecordFinished(
                phase=m.Phase.FINISHED,
                result="take the 9:10",
                error=None,
                usage=m.Usage(turns=1, prompt_tokens=50, completion_tokens=8),
            ),
        ),
    ]
    state_dir.mkdir()
    (state_dir / "runs.jsonl").write_bytes(b"".join(journal.encode(r) for r in records))


@pytest.fixture
async def runtime(stack: sched.Stack, tmp_path: Path) -> AsyncIterator[str]:
    """A runtime process that replays the journal above and lets the status page read it."""
    port = free_port()
    state_dir = tmp_path / "runtime-state"
    _write_journal(state_dir)
    args = ["runtime", "--port", str(port), "--state-dir", str(state_dir)]
    args += ["--dataplane", "http://127.0.0.1:1", "--cors-origin", stack.http]
    proc = await Proc(args, log_path=tmp_path / "runtime.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        await proc.wait_http(url + "/health")
        yield url
    finally:
        assert await proc.stop() == 0


async def test_status_page_shows_the_runtimes_runs_nested_under_their_parents(
    stack: sched.Stack, runtime: str, chromium: DevTools, tmp_path: Path
) -> None:
    page = await Page.open(chromium, f"{stack.http}/?runtime={runtime}")
    rows = await page.until(TREE_ROWS, lambda v: len(v) == 2)
    assert [(r["handle"], r["depth"]) for r in rows] == [("run-parent", 0), ("run-child", 1)]
    parent, child = (r["cells"] for r in rows)
    # run, state, class, turns, tool calls (failed), tokens, task; a parent's figures are its
    # own, then its subtree's.
    assert parent == [
        "run-parent",
        "finished",
        "interactive",
        "1 (\u03a3 3)",
        "0 (\u03a3 1)",
        "58 (\u03a3 293)",
        "plan the trip",
    ]
    assert child == ["\u2514 run-child", "finished", "batch", "2", "1", "235", "find trains"]
    line = await page.evaluate('document.getElementById("runtime-updated").textContent')
    assert line == f"runtime {runtime}: 2 runs \u00b7 2 finished"
    await page.screenshot(tmp_path / "status_page_runs.png")
