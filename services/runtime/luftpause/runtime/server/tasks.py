"""The MCP Tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663, protocol 2026-07-28)
for the `run` tool, on the SDK's extension hooks.

Shell module: an `mcp.server.extension.Extension` plus the task file `tasks.jsonl` (same line
format as the run journal, `journal.file.JournalFile`). A client that declares the extension in its
request capabilities gets a task from `run` instead of waiting in the call:

    tools/call run  -> {"resultType": "task", "taskId", "status": "working", ...}
    tasks/get       -> working | input_required (inputRequests: the approval questions, as in
                       `elicitation`, as far as the session's attention budget lets them be asked,
                       `question_gate`) | completed (result: run's CallToolResult) | failed |
                       cancelled
    tasks/update    -> inputResponses answer the approval question; {} back
    tasks/cancel    -> cancels the run (and its subtree); the task is cancelled

Records: {"v":1,"type":"task","task":ID,"run":H,"at":ISO} when made, {"v":1,"type":"taskEnded",
"task":ID,"status":"failed|cancelled","error":...} when failed or cancelled. A task still open
(its run not over) when the runtime stops is failed on the next start; its run resumes as usual.
A task leaves the file (for its archive) with its run, when retention lets the run go (`retain`).
On a shared journal (`journal.postgres`) the tasks are the database's: every replica answers for
every task (the others' task records reach it through `observe`), and an open task stays open
across a replica's restart, since its run goes on on another replica.
Any other client, and any other tool, passes through unchanged.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import structlog
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolRequestParams, CallToolResult, RequestParams
from mcp.types import TextContent as Text

from luftpause.common.auth import Identity
from luftpause.runtime.core import journal
from luftpause.runtime.core.errors import RequestError
from luftpause.runtime.journal.file import Store
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.people import elicitation
from luftpause.runtime.people.question_gate import TASKS_SESSION, session_of
from luftpause.runtime.server.auth import identity_of

IDENTIFIER = "io.modelcontextprotocol/tasks"
TASKS_NAME = "tasks.jsonl"
POLL_INTERVAL_MS = 250
RESTARTED = "the runtime restarted while the task was open; its run resumes (await its handle)"

log = structlog.get_logger(service="runtime")

# Spawns a run from `run`'s raw arguments, for a caller and the identity auth gave the request.
Spawn = Callable[[dict[str, Any], str, Identity], Awaitable[str]]


class TaskParams(RequestParams):
    task_id: str


class UpdateParams(RequestParams):
    task_id: str
    input_responses: dict[str, Any] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskEntry:
    """One task: the run it follows and, once failed or cancelled, why."""

    task_id: str
    run: str
    created_at: str
    ended: str | None = None
    error: str | None = None


def replay(records: list[dict[str, Any]]) -> dict[str, TaskEntry]:
    """The tasks a task file describes."""
    tasks: dict[str, TaskEntry] = {}
    for r in records:
        fold(tasks, r)
    return tasks


def fold(tasks: dict[str, TaskEntry], r: dict[str, Any]) -> None:
    """One task record applied to the tasks."""
    if r.get("type") == "task":
        tasks[r["task"]] = TaskEntry(task_id=r["task"], run=r["run"], created_at=r["at"])
    elif r.get("type") == "taskEnded" and r.get("task") in tasks:
        entry = tasks[r["task"]]
        tasks[r["task"]] = replace(entry, ended=r["status"], error=r.get("error"))


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TasksExtension(Extension):
    """Tasks for `run`, journaled in `tasks.jsonl`."""

    identifier = IDENTIFIER

    def __init__(
        self, runtime: Runtime, task_file: Store, spawn: Spawn, *, shared: bool = False
    ) -> None:
        self.runtime = runtime
        self.file = task_file
        self.spawn = spawn
        self.shared = shared
        self.tasks: dict[str, TaskEntry] = {}

    def observe(self, record: dict[str, Any]) -> None:
        """A task record another replica wrote (a shared journal)."""
        fold(self.tasks, record)

    async def resume(self) -> int:
        """Read the task file; fail the tasks whose run is not over (not on a shared journal,
        where their runs go on elsewhere). Returns how many."""
        self.tasks = replay(self.file.open())
        if self.shared:
            log.info("tasks.replayed", tasks=len(self.tasks), failed=0)
            return 0
        failed = 0
        for entry in list(self.tasks.values()):
            run = self.runtime.runs.get(entry.run)
            if entry.ended is None and (run is None or not run.state.phase.over):
                await self._end(entry, "failed", RESTARTED)
                failed += 1
        log.info("tasks.replayed", tasks=len(self.tasks), failed=failed)
        return failed

    async def retain(self, runs: Iterable[str]) -> int:
        """Let go of the tasks of runs retention let go (`Runtime.retain`): out of the task
        file, then out of memory; how many."""
        let_go = set(runs)
        gone = {t for t, entry in self.tasks.items() if entry.run in let_go}
        if gone:
            await self.file.archive(gone)
            for task_id in gone:
                self.tasks.pop(task_id, None)
        return len(gone)

    def close(self) -> None:
        self.file.close()

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding(method="tasks/get", params_type=TaskParams, handler=self._get),
            MethodBinding(method="tasks/update", params_type=UpdateParams, handler=self._update),
            MethodBinding(method="tasks/cancel", params_type=TaskParams, handler=self._cancel),
        ]

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name != "run" or not _opted_in(ctx):
            return await call_next(ctx)
        try:
            identity = identity_of(ctx.request)
            handle = await self.spawn(dict(params.arguments or {}), "mcp:tasks", identity)
        except (ToolError, RequestError) as exc:
            return CallToolResult(content=[Text(text=f"run refused: {exc}")], is_error=True)
        entry = TaskEntry(task_id=f"task-{uuid.uuid4().hex}", run=handle, created_at=_now())
        record = {"type": "task", "task": entry.task_id, "run": handle, "at": entry.created_at}
        await self.file.append({"v": journal.VERSION, **record})
        self.tasks[entry.task_id] = entry
        log.info("task.created", task=entry.task_id, run=handle)
        return {"resultType": "task", **(await self._view(entry))}

    # --- methods ---

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        return await self._view(await self._entry(params.task_id), session_of(ctx.request))

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        await self._entry(params.task_id)
        await elicitation.apply_answers(self.runtime, params.input_responses)
        return {}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
        entry = await self._entry(params.task_id)
        run = self.runtime.runs.get(entry.run)
        if entry.ended is None and run is not None and not run.state.phase.over:
            await self.runtime.cancel(entry.run)
            entry = await self._end(entry, "cancelled", None)
        return await self._view(entry)

    # --- helpers ---

    async def _entry(self, task_id: str) -> TaskEntry:
        if task_id not in self.tasks and self.runtime.sync is not None:
            await self.runtime.sync()  # made on another replica a moment ago?
        entry = self.tasks.get(task_id)
        if entry is None:
            raise MCPError(code=INVALID_PARAMS, message=f"no task {task_id}")
        return entry

    async def _end(self, entry: TaskEntry, status: str, error: str | None) -> TaskEntry:
        record = {"type": "taskEnded", "task": entry.task_id, "status": status, "error": error}
        await self.file.append({"v": journal.VERSION, **record})
        entry = replace(entry, ended=status, error=error)
        self.tasks[entry.task_id] = entry
        return entry

    async def _view(self, entry: TaskEntry, session: str = TASKS_SESSION) -> dict[str, Any]:
        """The task as tasks/get shows it; its questions as `session`'s attention allows."""
        out: dict[str, Any] = {
            "taskId": entry.task_id,
            "createdAt": entry.created_at,
            "lastUpdatedAt": _now(),
            "ttlMs": None,
            "pollIntervalMs": POLL_INTERVAL_MS,
        }
        if entry.ended == "failed":
            error = {"code": -32603, "message": entry.error or "failed"}
            return out | {"status": "failed", "statusMessage": entry.error, "error": error}
        if entry.ended == "cancelled":
            return out | {"status": "cancelled"}
        run = self.runtime.runs.get(entry.run)
        if run is None:  # let go by retention
            gone = f"run {entry.run} finished and was archived (--retain-finished)"
            return out | {"status": "failed", "statusMessage": gone,
                          "error": {"code": -32603, "message": gone}}  # fmt: skip
        if run.state.phase.over:
            summary = self.runtime.summary(entry.run)
            result = CallToolResult(
                content=[Text(text=json.dumps(summary))], structured_content=summary
            )
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            return out | {"status": "completed", "result": dumped}
        pending = self.runtime.approvals.pending([entry.run])
        pending = [
            (h, a) for h, a in pending if await self.runtime.questions.ask(session, h, a) is None
        ]
        if pending:
            requests = dict(elicitation.input_request(h, a) for h, a in pending)
            dumped_requests = {
                k: r.model_dump(by_alias=True, mode="json", exclude_none=True)
                for k, r in requests.items()
            }
            return out | {"status": "input_required", "inputRequests": dumped_requests}
        return out | {"status": "working", "statusMessage": f"run {entry.run} is {run.state.phase}"}


def _opted_in(ctx: ServerRequestContext[Any, Any]) -> bool:
    caps = ctx.session.client_capabilities
    return caps is not None and bool(caps.extensions) and IDENTIFIER in (caps.extensions or {})
