"""Driving runs: each run's task, which asks the state machine what to do next, does it, and
feeds the outcome back, every step journaled before the next.

Shell module: asyncio tasks, the journal, the model (through `context.wall`) and the tool
servers (through `rounds`). Two parts, built in this order because the neighbours between them
need the first and are needed by the second:

    Steps    one step of a run: the machine's next state, the records it asks for written as
             one line (a crash keeps all of it or none), and the end of a run carried out
             (counted, its run forgotten at the dataplane and the wall)
    Driver   a run's task: turns (each preceded by the compaction its history needs, `wall`)
             and rounds of tool calls (`rounds`), the budgets checked after every step
             (`budget_guard`); a cancel a user asked for is journaled as the run's end, a stop
             of the process is not (the run resumes from the journal)

`Runtime` (`runtime`) owns the runs and says when a run starts; nothing else starts a task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.trace import Span

from luftpause.runtime.context.wall import ContextWall
from luftpause.runtime.core import forks, journal
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.postgres import LeaseLost
from luftpause.runtime.loop import spans
from luftpause.runtime.loop.llm import Llm
from luftpause.runtime.loop.rounds import Rounds
from luftpause.runtime.loop.upstream import Upstreams, UpstreamTool
from luftpause.runtime.people.approvals import Approval
from luftpause.runtime.plans.budget_guard import BudgetGuard
from luftpause.runtime.plans.observed_journal import ObservedJournal
from luftpause.runtime.server.metrics import RuntimeMetrics

log = structlog.get_logger(service="runtime")


@dataclass(eq=False)
class Run:
    """A run's live state: the machine's state plus the task driving it."""

    state: m.RunState
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    cancel_reason: str | None = None
    approval: Approval | None = None
    # One question at a time: calls of a round settle concurrently and may ask again.
    asking: asyncio.Lock = field(default_factory=asyncio.Lock)
    # With tracing on, the run's `invoke_agent` span (`spans`), ended when its task ends.
    span: Span | None = None
    # Driven by this process; False: another replica drives it and this is its view.
    here: bool = True


class Steps:
    """One step of a run, journaled (module docstring)."""

    def __init__(
        self, journal_: ObservedJournal, llm: Llm, wall: ContextWall, metrics: RuntimeMetrics
    ) -> None:
        self.journal = journal_
        self.llm = llm
        self.wall = wall
        self.metrics = metrics

    async def apply(self, run: Run, event: m.Event) -> None:
        """Step the run's state, then journal what the step asks for (one line: a crash keeps
        all of it or none) and carry out the rest."""
        handle = run.state.spec.handle
        run.state, decisions = m.step(run.state, event)
        records = [r for d in decisions if (r := journal.record_of(handle, d)) is not None]
        if records:
            line = records[0] if len(records) == 1 else forks.batch_record(records)
            await self.journal.append(line)
        for d in decisions:
            if isinstance(d, m.RecordFinished):
                run.done.set()
                self.metrics.finished(run.state.spec.service_class, d.phase)
                log.info("run.over", run=handle, state=d.phase.value, error=d.error)
                await self.llm.forget_run(handle)
                self.wall.forget(handle)


class Driver:
    """Each run's task (module docstring)."""

    def __init__(
        self,
        steps: Steps,
        rounds: Rounds[Run],
        budgets: BudgetGuard[Run],
        upstreams: Upstreams,
        *,
        clock: Callable[[], float],
        stale: set[str],
    ) -> None:
        self.steps = steps
        self.rounds = rounds
        self.budgets = budgets
        self.upstreams = upstreams
        self.clock = clock
        self.stale = stale  # the runtime's: runs stopped here by a lost lease, to re-read
        self.stopping = False  # set by the runtime's stop: a cancel is no longer journaled
        self.background: set[asyncio.Task[Any]] = set()

    def start(self, run: Run) -> None:
        """Start the run's task."""
        run.task = asyncio.create_task(self._drive(run), name=f"run {run.state.spec.handle}")
        run.task.add_done_callback(lambda _: self._cancelled_unstarted(run))

    def background_task(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` in a task of its own, cancelled by the runtime's stop."""
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def _cancelled_unstarted(self, run: Run) -> None:
        """A task cancelled before its first step never ran `_steps`, so never saw the cancel
        (`cancel` would wait for it forever): journal the run's end here instead."""
        reason = run.cancel_reason
        if reason is not None and not run.state.phase.over and not self.stopping:
            self.background_task(self._end_unstarted(run, reason))

    async def _end_unstarted(self, run: Run, reason: str) -> None:
        await self.steps.apply(run, m.Cancel(reason=reason, at=self.clock()))
        if run.span is not None and run.span.is_recording():
            spans.ended(run.span, run.state)

    async def _drive(self, run: Run) -> None:
        if run.span is None:
            await self._steps(run)
            return
        try:
            with trace.use_span(run.span):
                await self._steps(run)
        finally:
            spans.ended(run.span, run.state)

    async def _steps(self, run: Run) -> None:
        handle = run.state.spec.handle
        apply = self.steps.apply
        try:
            while (decision := m.next_decision(run.state)) is not None:
                if isinstance(decision, m.StartTurn):
                    await self.rounds.held_while_stopping()
                    if await self.budgets.stopped_before_turn(run):
                        return
                    await apply(run, await self._turn(run.state, decision))
                else:
                    offered = await self.offered(run.state.spec)
                    await self.rounds.call(run, decision.calls, offered)
                await self.budgets.check(handle)
        except asyncio.CancelledError:
            if run.cancel_reason is None or not run.here:
                raise  # the process is stopping: nothing is journaled, the run resumes
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await apply(run, m.Cancel(reason=run.cancel_reason, at=self.clock()))
        except Exception as exc:  # a bug must not leave an awaiter waiting forever
            if _lease_lost(exc):
                run.here = False  # another replica drives it now (`lost` brings its state)
                self.stale.add(handle)
                log.warning("run.lease_lost", run=handle)
                return
            log.exception("run.crashed", run=handle)
            await apply(run, m.TurnFailed(error=f"internal error: {exc!r}", at=self.clock()))

    async def offered(self, spec: m.RunSpec) -> dict[str, UpstreamTool]:
        """The tools the run may call: every upstream tool, or those its spec names."""
        catalogue = await self.upstreams.catalogue()
        if spec.tools is None:
            return catalogue
        return {k: v for k, v in catalogue.items() if k in spec.tools}

    async def _turn(self, state: m.RunState, decision: m.StartTurn) -> m.Event:
        """The run's next turn; or first the compaction its history needs to fit (`wall`)."""
        # The tools stay in every turn's request, also once the run's calls are spent (then
        # with tool_choice none): the engine renders them at the prompt's start, so dropping
        # them would make the last turn re-read the whole conversation instead of its cache.
        tools = [t.openai() for t in (await self.offered(state.spec)).values()]
        return await self.steps.wall.turn(state, decision, tools, self.clock)


def _lease_lost(exc: Exception) -> bool:
    """The run's lease went elsewhere (also from inside a round's task group)."""
    if isinstance(exc, ExceptionGroup):
        return exc.subgroup(LeaseLost) is not None
    return isinstance(exc, LeaseLost)
