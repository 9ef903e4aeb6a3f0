"""The attention budget's shell: the one `attention.Attention` of a runtime, who is asked when,
the `away` switches (the MCP tool per session, `POST /away` for scripts) and the waiting
questions `status` lists.

Shell module: reads the clock, wakes the waits of `elicitation` when a switch changes, and
journals the asks and the switches (`attention.jsonl` beside the run journal; the records and
their replay are `attention`'s) before a question is shown or a switch answered, so a restart
keeps the budget spent in the last hour and every switch. A question shown again is journaled
again only once its last record is `REJOURNAL_AFTER` old (a task is polled several times a
second), so after a restart its hour may end up to that much early. On start the file is
replayed, then written again as the fewest records that hold its state (`compact`). It knows
runs only as `(handle, pending approval)` pairs (`Pending`), so `loop.runtime` can hold it
without a cycle.

    GET  /away                       {"everyone": bool, "sessions": [...], "perHour": N}
    POST /away {"on": bool}          the switch for every session (scripts: "I'm away")
    POST /away {"on": bool, "session": ID}   one MCP session's switch
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import structlog
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from luftpause.runtime.core import attention as a
from luftpause.runtime.core import journal
from luftpause.runtime.core.values import ToolCall
from luftpause.runtime.journal.file import JournalFile

_SWITCH = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
TASKS_SESSION = "mcp:tasks"  # a task's questions without a session id
ATTENTION_NAME = "attention.jsonl"
REJOURNAL_AFTER = 60.0  # seconds before a question shown again is journaled again

log = structlog.get_logger(service="runtime")


class Pending(Protocol):
    """An approval a run waits for (`approvals.Approval`)."""

    @property
    def call(self) -> ToolCall: ...

    @property
    def since(self) -> float: ...


class Questions:
    """Who may be asked now; one per runtime."""

    def __init__(
        self,
        per_hour: int = a.DEFAULT_PER_HOUR,
        *,
        clock: Callable[[], float] = time.time,
        window: float = a.WINDOW,
        on_asked: Callable[[], None] | None = None,
        journal_file: JournalFile | None = None,
    ) -> None:
        self.state = a.Attention(per_hour=per_hour, window=window)
        self.on_asked = on_asked  # the metrics' counter
        self.clock = clock
        self.journal = journal_file  # None: nothing journaled (tests of the budget alone)
        self._journaled: dict[tuple[str, str], float] = {}  # (session, key) -> its record's at
        self._watchers: set[asyncio.Event] = set()

    def resume(self) -> None:
        """Replay the journal (if any) and write it again as the fewest records (`compact`)."""
        if self.journal is None:
            return
        self.state = a.replay(self.state, self.journal.open())
        now = self.clock()
        self.journal.close()
        try:
            compact(self.journal.path, a.records(self.state, now))
        except OSError as exc:  # a full disk: keep appending to the file as it is
            log.warning("attention.not_compacted", path=str(self.journal.path), error=repr(exc))
        self.journal.open()
        for s, _ in self.state.asks:
            for x in self.state.asked_by(s, now):
                self._journaled[(s, x.key)] = x.at
        log.info("attention.replayed", sessions=len(self.state.asks), away=len(self.state.away))

    async def ask(self, session: str, handle: str, pending: Pending) -> a.Hold | None:
        """None, and the ask counted (and journaled), when `session` may ask about `pending`
        now; else why not."""
        key = f"{handle}/{pending.call.id}"
        now = self.clock()
        held = a.hold(self.state, session, key, now)
        if held is not None:
            return held
        fresh = all(x.key != key for x in self.state.asked_by(session, now))
        self.state = a.asked(self.state, session, key, now)
        if fresh:  # not every showing: a task is polled several times a second
            log.info("approval.asked", session=session, run=handle, tool=pending.call.name)
            if self.on_asked is not None:
                self.on_asked()
        last = self._journaled.get((session, key))
        if self.journal is not None and (fresh or last is None or now - last >= REJOURNAL_AFTER):
            self._journaled[(session, key)] = now
            await self.journal.append(a.asked_record(session, key, now))
        return None

    async def set_away(self, session: str, on: bool) -> dict[str, object]:
        """Turn `session`'s away switch (`attention.EVERYONE`: everybody's) on or off."""
        self.state = a.set_away(self.state, session, on)
        if self.journal is not None:
            await self.journal.append(a.away_record(session, on))
        log.info("attention.away", session=session, on=on)
        for event in self._watchers:
            event.set()
        return self.view(session)

    def view(self, session: str) -> dict[str, object]:
        return a.view(self.state, session, self.clock())

    def switches(self) -> dict[str, object]:
        away = self.state.away
        return {
            "everyone": a.EVERYONE in away,
            "sessions": sorted(s for s in away if s != a.EVERYONE),
            "perHour": self.state.per_hour,
        }

    @contextmanager
    def watching(self, event: asyncio.Event) -> Iterator[asyncio.Event]:
        """Set `event` whenever an away switch changes, while inside."""
        self._watchers.add(event)
        try:
            yield event
        finally:
            self._watchers.discard(event)

    def status(self, pending: Iterable[tuple[str, Pending]], session: str) -> dict[str, object]:
        """What `status` adds: the waiting questions and `session`'s attention budget."""
        return {"questions": self.waiting(pending), "attention": self.view(session)}

    def waiting(self, pending: Iterable[tuple[str, Pending]]) -> list[dict[str, object]]:
        """The questions of `pending`, oldest first, as `status` lists them."""
        now = self.clock()
        found = [
            a.Waiting(
                handle=h,
                call_id=p.call.id,
                tool=p.call.name,
                arguments=p.call.arguments,
                since=p.since,
            )
            for h, p in pending
        ]
        return [a.describe(w, now) for w in a.oldest_first(found)]


def session_of(request: Any) -> str:
    """The MCP session of an HTTP request (its `mcp-session-id`), else `TASKS_SESSION`."""
    headers = getattr(request, "headers", None)
    found = headers.get("mcp-session-id") if headers is not None else None
    return str(found) if found else TASKS_SESSION


def parse_switch(raw: bytes) -> tuple[str, bool]:
    """`POST /away`'s body: the session (`EVERYONE` when not named) and on/off; ValueError."""
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("on"), bool):
        raise ValueError('the body must be {"on": true|false} with an optional "session"')
    session = body.get("session", a.EVERYONE)
    if not isinstance(session, str) or not session:
        raise ValueError('"session" must be a non-empty string (an MCP session id)')
    return session, bool(body["on"])


async def away_route(questions: Questions, request: Request) -> Response:
    """GET or POST /away, as the module docstring says."""
    if request.method == "POST":
        try:
            session, on = parse_switch(await request.body())
        except ValueError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
        await questions.set_away(session, on)
    return JSONResponse(questions.switches())


def add_attention(
    server: MCPServer, questions: Questions, session_of_ctx: Callable[[Context[Any, Any]], str]
) -> None:
    """The `away` tool (the session of each call is `session_of_ctx`'s) and `/away`."""

    async def away(on: bool, ctx: Context[Any, Any]) -> dict[str, object]:
        """Hold every approval question to this session while `on` (you are away): runs that
        need an approval wait in AwaitingApproval and status lists their questions; once it is
        off they are asked, oldest first, as the attention budget allows. approve answers any
        of them meanwhile."""
        return await questions.set_away(session_of_ctx(ctx), on)

    async def away_http(request: Request) -> Response:
        return await away_route(questions, request)

    server.add_tool(away, name="away", annotations=_SWITCH, structured_output=True)
    server.custom_route("/away", methods=["GET", "POST"])(away_http)


def compact(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the file at `path` with `records`, whole or not at all (a new file, fsync'd,
    renamed over it, the directory fsync'd)."""
    fresh = path.with_name(path.name + ".new")
    with fresh.open("wb") as f:
        f.write(b"".join(journal.encode(r) for r in records))
        f.flush()
        os.fsync(f.fileno())
    os.replace(fresh, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`luftpause runtime`'s flag for the attention budget."""

    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
        return value

    p.add_argument(
        "--approvals-per-hour",
        type=count,
        default=a.DEFAULT_PER_HOUR,
        metavar="N",
        help="approval questions each MCP session may be asked per rolling hour; past it (or "
        "while it is away) questions wait, listed by status; 0: never ask (approve answers)",
    )
