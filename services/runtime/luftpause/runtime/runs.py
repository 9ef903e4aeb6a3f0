"""The runs of one runtime process: spawn, drive, await, cancel, and resume after a restart.

Shell module: asyncio tasks, the journal file (`store`), the model (`llm`) and the tool
servers (`upstream`). Each run is one task that asks the pure state machine (`machine`) what
to do next, does it, and feeds the outcome back; every decision to journal is written (and
fsync'd) before the next turn starts. Stopping the process cancels the tasks without
journaling anything, so the runs resume from the journal on the next start; `cancel` is a
user's decision and is journaled as the run's end.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

import structlog

from luftpause.runtime import hygiene, journal
from luftpause.runtime import machine as m
from luftpause.runtime.errors import RequestError, TurnError
from luftpause.runtime.llm import Llm
from luftpause.runtime.store import JournalFile
from luftpause.runtime.upstream import Upstreams, UpstreamTool

log = structlog.get_logger(service="runtime")


@dataclass(eq=False)
class Run:
    """A run's live state: the machine's state plus the task driving it."""

    state: m.RunState
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    cancel_reason: str | None = None


class Runtime:
    """Every run, from the journal on start to the last task on stop."""

    def __init__(self, journal_file: JournalFile, llm: Llm, upstreams: Upstreams) -> None:
        self.journal = journal_file
        self.llm = llm
        self.upstreams = upstreams
        self.runs: dict[str, Run] = {}

    # --- lifecycle ---

    def resume(self) -> int:
        """Replay the journal; finished runs answer, unfinished ones start again. Returns them."""
        replayed = journal.replay(self.journal.open())
        resumed = 0
        for handle, state in replayed.runs.items():
            run = Run(state=state)
            self.runs[handle] = run
            if state.phase.over:
                run.done.set()
            else:
                self._start(run)
                resumed += 1
        log.info("runtime.replayed", runs=len(replayed.runs), resumed=resumed)
        return resumed

    async def stop(self) -> None:
        """Cancel every task without journaling: the runs resume on the next start."""
        tasks = [r.task for r in self.runs.values() if r.task is not None and not r.task.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.journal.close()

    # --- tools ---

    async def spawn(self, spec: m.RunSpec) -> str:
        if spec.parent is not None and spec.parent not in self.runs:
            raise RequestError(f"unknown parent run {spec.parent}")
        await self.journal.append(journal.spawned_record(spec))
        run = Run(state=m.start(spec))
        self.runs[spec.handle] = run
        self._start(run)
        log.info("run.spawned", run=spec.handle, parent=spec.parent)
        return spec.handle

    async def await_runs(
        self, handles: list[str], mode: str, timeout: float
    ) -> list[dict[str, Any]]:
        """Wait until all (or any) of the runs are over, or the timeout; then their states."""
        runs = [self.runs.get(h) for h in handles]
        waits = [asyncio.ensure_future(r.done.wait()) for r in runs if r is not None]
        try:
            if waits:
                when = asyncio.FIRST_COMPLETED if mode == "any" else asyncio.ALL_COMPLETED
                await asyncio.wait(waits, timeout=timeout, return_when=when)
        finally:
            for w in waits:
                w.cancel()
        return [self.summary(h) for h in handles]

    def summary(self, handle: str) -> dict[str, Any]:
        run = self.runs.get(handle)
        if run is None:
            return {"handle": handle, "state": "unknown", "error": f"no run {handle}"}
        out = m.summary(run.state)
        out["children"] = [h for h, r in self.runs.items() if r.state.spec.parent == handle]
        return out

    async def cancel(self, handle: str, reason: str = "cancelled") -> list[str]:
        """Cancel a run and its running descendants; the handles cancelled."""
        if handle not in self.runs:
            raise RequestError(f"no run {handle}")
        cancelled = []
        for h in [handle, *self.descendants(handle)]:
            run = self.runs[h]
            if run.state.phase.over or run.task is None:
                continue
            run.cancel_reason = reason
            run.task.cancel()
            cancelled.append(h)
        await asyncio.gather(*(self.runs[h].done.wait() for h in cancelled))
        return cancelled

    def descendants(self, handle: str) -> list[str]:
        out: list[str] = []
        frontier = [handle]
        while frontier:
            parent = frontier.pop()
            kids = [h for h, r in self.runs.items() if r.state.spec.parent == parent]
            out += kids
            frontier += kids
        return out

    async def tools(self) -> list[dict[str, Any]]:
        return [t.describe() for t in (await self.upstreams.catalogue()).values()]

    # --- the agent loop ---

    def _start(self, run: Run) -> None:
        run.task = asyncio.create_task(self._drive(run), name=f"run {run.state.spec.handle}")

    async def _drive(self, run: Run) -> None:
        try:
            while (decision := m.next_decision(run.state)) is not None:
                event: m.Event
                if isinstance(decision, m.StartTurn):
                    try:
                        event = await self._turn(run.state.spec, decision)
                    except TurnError as exc:
                        event = m.TurnFailed(error=str(exc))
                else:
                    results = await self._call_tools(run.state.spec, decision.calls)
                    event = m.ToolsReturned(results=results)
                await self._apply(run, event)
        except asyncio.CancelledError:
            if run.cancel_reason is None:
                raise  # the process is stopping: nothing is journaled, the run resumes
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._apply(run, m.Cancel(reason=run.cancel_reason))
        except Exception as exc:  # a bug must not leave an awaiter waiting forever
            log.exception("run.crashed", run=run.state.spec.handle)
            await self._apply(run, m.TurnFailed(error=f"internal error: {exc!r}"))

    async def _apply(self, run: Run, event: m.Event) -> None:
        handle = run.state.spec.handle
        run.state, decisions = m.step(run.state, event)
        for d in decisions:
            if isinstance(d, m.RecordRound):
                await self.journal.append(journal.round_record(handle, d))
            elif isinstance(d, m.RecordFinished):
                await self.journal.append(journal.finished_record(handle, d))
                run.done.set()
                log.info("run.over", run=handle, state=d.phase.value, error=d.error)
                await self.llm.forget_run(handle)

    async def _offered(self, spec: m.RunSpec) -> dict[str, UpstreamTool]:
        catalogue = await self.upstreams.catalogue()
        if spec.tools is None:
            return catalogue
        return {k: v for k, v in catalogue.items() if k in spec.tools}

    async def _turn(self, spec: m.RunSpec, decision: m.StartTurn) -> m.TurnCompleted:
        tools = []
        if decision.offer_tools:
            tools = [t.openai() for t in (await self._offered(spec)).values()]
        return await self.llm.turn(spec, decision.messages, tools)

    async def _call_tools(
        self, spec: m.RunSpec, calls: tuple[m.ToolCall, ...]
    ) -> tuple[m.ToolResult, ...]:
        offered = await self._offered(spec)
        return tuple(await asyncio.gather(*(self._call_one(c, offered) for c in calls)))

    async def _call_one(self, call: m.ToolCall, offered: dict[str, UpstreamTool]) -> m.ToolResult:
        tool = offered.get(call.name)
        if tool is None:
            names = ", ".join(sorted(offered)) or "none"
            why = f"Error: no tool named {call.name}; the tools are: {names}"
            return m.ToolResult(call_id=call.id, name=call.name, content=why, ok=False)
        args, why = hygiene.check_arguments(call.arguments, tool.tool.input_schema or {})
        if args is None:
            return m.ToolResult(call_id=call.id, name=call.name, content=f"Error: {why}", ok=False)
        return await self.upstreams.call(call, args, tool)


def new_handle() -> str:
    return f"run-{uuid.uuid4().hex[:16]}"
