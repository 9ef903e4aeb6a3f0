"""The runs of one runtime process: spawn, await, cancel, and resume after a restart.

Shell module: asyncio tasks, the journal (`journal.file`, or `journal.postgres`), the model
(`llm`) and the tool servers (`upstream`). Each run is one task (`driver`) that asks the pure
state machine (`core.machine`) what to do next, does it, and feeds the outcome back; every
decision to journal is written (and fsync'd) before the next step. Stopping the process cancels
the tasks without journaling anything, so the runs resume from the journal on the next start;
`cancel` is a user's decision and is journaled as the run's end.

What the loop hands to its neighbours, each knowing it only through the callbacks it is built
with (step a run and journal the step, cancel a subtree):

    rounds       a round's tool calls, concurrent (`toolcalls`), each journaled as it happens
                 (the turn before its first call, each send before the request leaves, each
                 result as it arrives, the round's last one as the round); a call journaled as
                 sent whose result never was goes through `resend`'s rule after a restart.
                 Stopping first lets the calls out return for a grace period (`Rounds.drain`).
    approvals    a call that needs the user's yes waits there until `approve` (or an answer to
                 an elicitation, `elicitation`) gives it; whom to ask when is `question_gate`'s
    budgets      the budgets' checks after every step, on spawn and by timer, and their trips
                 (`budget_guard`); what a run costs and will is the `planner`'s
    wall         a turn that would not fit the model's context window is preceded by a
                 compaction of the run's history (`context.wall`), journaled like a round

The records one event asks for are written as one line. Spawns and ends are counted in
`metrics` where they happen. With tracing on, a run's task runs inside its `invoke_agent` span
and each tool call inside an `execute_tool` span (`spans`); the run's span context is journaled
with its spec.

On a shared journal (`journal.postgres`, several replicas) a run is driven here (`Run.here`)
only while this replica holds its lease; every other run is a view, kept by the records the other
replicas write (`observe`), so status, await and export answer for any run. `take` starts
driving runs whose lease this replica claimed, from their journaled state; `lost` stops a run
whose lease another replica took, without journaling. Cancel and approve of a run driven
elsewhere go to its replica (`remote`, `fleet`); budgets are tripped by the replica that drives
the run over its limit, which sees its subtree's spend through the views.
Retention (`retain`) lets go of finished trees past an age: out of the journal and out of memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

import structlog
from opentelemetry.trace import Span

from luftpause.common import tracing
from luftpause.runtime.context.wall import ContextWall
from luftpause.runtime.core import budget, forks, journal, retention
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.errors import JournalUnwritable, RequestError
from luftpause.runtime.journal.file import Store
from luftpause.runtime.loop import spans
from luftpause.runtime.loop.driver import Driver, Run, Steps
from luftpause.runtime.loop.llm import Llm
from luftpause.runtime.loop.rounds import Rounds
from luftpause.runtime.loop.toolcalls import ToolCaller
from luftpause.runtime.loop.upstream import TOOL_TIMEOUT, Upstreams
from luftpause.runtime.people.approvals import Approvals
from luftpause.runtime.people.question_gate import Questions
from luftpause.runtime.plans.budget_guard import BudgetGuard
from luftpause.runtime.plans.planner import Planner
from luftpause.runtime.server.metrics import RuntimeMetrics

_SEEN_OVER = 10.0  # seconds a cancel done elsewhere waits for its end to reach the view here

# Asks the replica that drives a run to do something to it: (run, "cancel"|"approve", args) ->
# its reply (`fleet`); a reply with "error" was refused there.
Remote = Callable[[str, str, dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]

log = structlog.get_logger(service="runtime")


class Runtime:
    """Every run, from the journal on start to the last task on stop."""

    def __init__(
        self,
        journal_file: Store,
        llm: Llm,
        upstreams: Upstreams,
        *,
        clock: Callable[[], float] = time.time,
        metrics: RuntimeMetrics | None = None,
        questions: Questions | None = None,
        wall: ContextWall | None = None,
        planner: Planner | None = None,
        tool_timeout: float = TOOL_TIMEOUT,
    ) -> None:
        self.llm = llm
        caller = ToolCaller(upstreams, timeout=tool_timeout)
        self.questions = Questions(clock=clock) if questions is None else questions
        self.wall = ContextWall(llm) if wall is None else wall
        self.upstreams = upstreams
        self.clock = clock
        self.runs: dict[str, Run] = {}
        self.metrics = RuntimeMetrics() if metrics is None else metrics
        self.metrics.bind(self.runs)
        # Prices, forecasts, the seconds budget's look ahead: learned from every journal record
        # (the journal is written through the planner, which sees each record go by).
        self.planner = Planner() if planner is None else planner
        self.journal = self.planner.observed(journal_file, self.metrics.spent)
        self.steps = Steps(self.journal, llm, self.wall, self.metrics)
        apply = self.steps.apply
        self.stale: set[str] = set()  # runs stopped here by a lost lease, state to re-read
        self.approvals: Approvals[Run] = Approvals(self.runs, apply, clock)
        self.budgets: BudgetGuard[Run] = BudgetGuard(
            self.runs,
            apply=apply,
            cancel=self.cancel,
            background=self._background_task,
            planner=self.planner,
            metrics=self.metrics,
            clock=clock,
        )
        self.rounds: Rounds[Run] = Rounds(caller, self.metrics, apply, self.approvals.ask)
        self.driver = Driver(
            self.steps, self.rounds, self.budgets, upstreams, clock=clock, stale=self.stale
        )
        self.remote: Remote | None = None  # set on a shared journal (`fleet`)
        # Catches the views up with the shared journal (`fleet`): a handle spawned elsewhere a
        # moment ago is known once it returns.
        self.sync: Callable[[], Coroutine[Any, Any, None]] | None = None
        self.beginning: set[str] = set()  # runs whose first record is being journaled here

    # --- lifecycle ---

    def resume(self, *, drive: bool = True) -> int:
        """Replay the journal; finished runs answer, unfinished ones start again (with `drive`
        false they stay views until their lease is taken, `take`). Returns how many started."""
        replayed = journal.replay(self.journal.open())
        resumed = 0
        for handle, state in replayed.runs.items():
            run = Run(state=state, here=drive)
            self.runs[handle] = run
            if drive:
                resumed += self._enter(run)
            elif state.phase.over:
                run.done.set()
        self.budgets.cancel_exceeded(self.runs)
        log.info("runtime.replayed", runs=len(replayed.runs), resumed=resumed)
        return resumed

    # --- a shared journal ---

    def observe(self, record: dict[str, Any]) -> None:
        """A record another replica wrote: the views of its runs step; a budget it takes over
        its limit is tripped if this replica drives that run."""
        learn = getattr(self.journal, "learn", None)
        for r in forks.expand([record]):
            if learn is not None:
                learn(r)
            handle = str(r.get("run"))
            run = self.runs.get(handle)
            if r.get("type") in forks.STARTS:
                if run is None:
                    self.runs[handle] = run = Run(state=forks.begin(r), here=False)
                continue
            if run is None or run.here:
                continue
            new = journal.apply(run.state, r)
            if new is not None:
                run.state = new
                if new.phase.over:
                    run.done.set()
            self._background_task(self.budgets.check(handle))

    def take(self, states: dict[str, m.RunState]) -> list[str]:
        """Drive runs whose lease this replica claimed, from their journaled states."""
        taken: dict[str, Run] = {}
        for handle, state in states.items():
            run = self.runs.get(handle)
            if (run is not None and run.here) or handle in self.beginning:
                continue  # driven here already (its finished record may be on its way)
            if run is None:
                run = self.runs[handle] = Run(state=state)
            run.state, run.here = state, True
            if self._enter(run):
                taken[handle] = run
        self.budgets.cancel_exceeded(taken)
        if taken:
            log.info("runs.taken_over", runs=sorted(taken))
        return sorted(taken)

    async def lost(self, states: dict[str, m.RunState]) -> None:
        """Stop driving runs another replica took (nothing journaled); they become views, at
        the journaled states given."""
        tasks = []
        for handle, state in states.items():
            run = self.runs.get(handle)
            if run is None:
                continue
            run.here = False
            if run.task is not None and not run.task.done():
                run.task.cancel()
                tasks.append(run.task)
            run.state = state
            if state.phase.over:
                run.done.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for handle in states:
            self.budgets.stop_timer(handle)
        if states:
            log.warning("runs.lease_lost", runs=sorted(states))

    async def known(self, handles: list[str]) -> None:
        """On a shared journal, catch up with it first if a handle is not known here yet."""
        if self.sync is not None and any(h not in self.runs for h in handles):
            await self.sync()

    async def command(self, handle: str, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        """Carry out what another replica asked of a run driven here (`remote`)."""
        try:
            if kind == "cancel":
                return {"cancelled": await self.cancel(handle, str(args.get("reason")))}
            if kind == "approve":
                call = args.get("call")
                return await self.approve(handle, bool(args["allow"]), None if call is None
                                          else str(call))  # fmt: skip
            return {"error": f"unknown command {kind}"}
        except RequestError as exc:
            return {"error": str(exc)}

    async def _ask_remote(self, handle: str, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        assert self.remote is not None
        reply = await self.remote(handle, kind, args)
        if "error" in reply:
            raise RequestError(str(reply["error"]))
        return reply

    def _elsewhere(self, handle: str) -> bool:
        run = self.runs.get(handle)
        return run is not None and not run.here and not run.state.phase.over

    # --- retention ---

    async def retain(self, age: float) -> list[str]:
        """Let go of finished trees older than `age` seconds (`retention`): out of the journal,
        then out of memory; their handles."""
        gone = retention.expired(self.runs, self.clock(), age)
        if not gone:
            return []
        await self.journal.archive(gone)
        for handle in gone:
            self.runs.pop(handle, None)
        log.info("runs.archived", runs=len(gone), live=len(self.runs))
        return sorted(gone)

    def _enter(self, run: Run) -> bool:
        """A replayed run: over, it answers; else its task starts (True)."""
        self.budgets.start_timer(run)
        if run.state.phase.over:
            run.done.set()
            return False
        if tracing.enabled():
            run.span = spans.resume_run(run.state.spec)
        self.driver.start(run)
        return True

    async def adopt(self, record: dict[str, Any]) -> list[str]:
        """Journal a record that begins runs (a fork's or an import's batch, `forks`), then run
        them as `resume` does; their handles. `RequestError` if one exists already."""
        replayed = journal.replay([record])
        taken = sorted(h for h in replayed.runs if h in self.runs)
        if taken or not replayed.runs:
            raise RequestError(f"runs exist already: {', '.join(taken)}" if taken else "no runs")
        entered = {h: Run(state=s) for h, s in replayed.runs.items()}
        self.runs.update(entered)  # before the write: a concurrent adopt of them is refused
        try:
            await self._begin(record)
        except BaseException:
            for h in entered:
                self.runs.pop(h, None)
            raise
        for run in entered.values():
            if self._enter(run):
                self.metrics.spawned(run.state.spec.service_class)
        for h in entered:
            await self.budgets.check(h)
        return list(entered)

    async def stop(self, grace: float = 0.0) -> None:
        """Cancel every task without journaling: the runs resume on the next start. First, for
        up to `grace` seconds, tool calls already sent may return and be journaled (nothing new
        is sent and no turn begins meanwhile), so a stop does not leave their outcome unknown."""
        self.driver.stopping = True
        await self.rounds.drain(grace)
        tasks = [r.task for r in self.runs.values() if r.task is not None and not r.task.done()]
        tasks += [*self.budgets.timers(), *self.driver.background]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for run in self.runs.values():  # a task cancelled before it ran never ended its span
            if run.span is not None and run.span.is_recording():
                spans.ended(run.span, run.state)
        self.journal.close()

    # --- tools ---

    async def _begin(self, record: dict[str, Any]) -> None:
        """Journal a record that begins runs, or refuse them (`JournalUnwritable`)."""
        handles = {str(r.get("run")) for r in forks.expand([record])}
        self.beginning |= handles  # their leases are ours before they are in `runs`
        try:
            await self.journal.append(record, retry=False)
        except OSError as exc:
            raise _unwritable(self.journal.failing or repr(exc)) from exc
        finally:
            self.beginning -= handles

    async def spawn(self, spec: m.RunSpec, *, caller_trace: str | None = None) -> str:
        """Start a run; `caller_trace` is the traceparent of the request that asked for it."""
        if spec.parent is not None:
            if spec.parent not in self.runs:
                raise RequestError(f"unknown parent run {spec.parent}")
            blocked = budget.blocking(self.runs, spec.parent)
            if blocked is not None:
                raise RequestError(f"parent's {blocked.reason}")
        spec = self.planner.priced(replace(spec, spawned_at=self.clock()), self.runs)
        span = self._run_span(spec, caller_trace) if tracing.enabled() else None
        if span is not None:
            spec = replace(spec, traceparent=tracing.traceparent_of(span) or None)
        try:
            await self._begin(journal.spawned_record(spec))
        except JournalUnwritable:
            if span is not None:
                span.end()
            raise
        run = Run(state=m.start(spec), span=span)
        self.runs[spec.handle] = run
        self.driver.start(run)
        self.budgets.start_timer(run)
        self.metrics.spawned(spec.service_class)
        log.info("run.spawned", run=spec.handle, parent=spec.parent)
        await self.budgets.check(spec.handle)
        return spec.handle

    async def await_runs(
        self,
        handles: list[str],
        mode: str,
        timeout: float,
        *,
        interrupt: asyncio.Event | None = None,
    ) -> list[dict[str, Any]]:
        """Wait until all (or any) of the runs are over, the timeout, or `interrupt` is set."""
        await self.known(handles)
        runs = [r for h in handles if (r := self.runs.get(h)) is not None]
        if runs:
            waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(_over(runs, mode))]
            if interrupt is not None:
                waits.append(asyncio.ensure_future(interrupt.wait()))
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
        return [self.summary(h) for h in handles]

    def summary(self, handle: str) -> dict[str, Any]:
        run = self.runs.get(handle)
        if run is None:
            return {"handle": handle, "state": "unknown", "error": f"no run {handle}"}
        out = m.summary(run.state)
        out["children"] = [h for h, r in self.runs.items() if r.state.spec.parent == handle]
        view = budget.view(self.runs, handle, self.clock())
        if view is not None:
            out["budget"] = view
        out["spend"] = self.planner.spend(self.runs, handle, self.clock())
        return out

    async def cancel(self, handle: str, reason: str = "cancelled") -> list[str]:
        """Cancel a run and its running descendants; the handles cancelled."""
        await self.known([handle])
        if handle not in self.runs:
            raise RequestError(f"no run {handle}")
        if self._elsewhere(handle):
            reply = await self._ask_remote(handle, "cancel", {"reason": reason})
            cancelled = [str(h) for h in reply.get("cancelled", [])]
            await self._seen_over(cancelled)
            return cancelled
        cancelled, remote = [], []
        for h in [handle, *self.descendants(handle)]:
            run = self.runs[h]
            if self._elsewhere(h) and self.remote is not None:
                remote.append(self._ask_remote(h, "cancel", {"reason": reason}))
                continue
            if run.state.phase.over or run.task is None or run.task.done():
                continue
            run.cancel_reason = reason
            run.task.cancel()
            cancelled.append(h)
        replies = await asyncio.gather(*remote, return_exceptions=True)
        await asyncio.gather(*(self.runs[h].done.wait() for h in cancelled))
        for answer in replies:
            if isinstance(answer, dict):
                cancelled += [str(h) for h in answer.get("cancelled", []) if h not in cancelled]
        await self._seen_over(cancelled)
        return cancelled

    async def _seen_over(self, handles: list[str]) -> None:
        """Wait (a bounded while) until the views of runs ended elsewhere show them over."""
        waits = [r.done.wait() for h in handles if (r := self.runs.get(h)) is not None]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_SEEN_OVER):
                await asyncio.gather(*waits)

    def descendants(self, handle: str) -> list[str]:
        return budget.subtree(handle, budget.children(self.runs))[1:]

    async def tools(self) -> list[dict[str, Any]]:
        return [t.describe() for t in (await self.upstreams.catalogue()).values()]

    # --- approvals ---

    async def approve(self, handle: str, allow: bool, call_id: str | None = None) -> dict[str, Any]:
        """Answer the run's pending approval (`approvals`); returns once the answer is journaled,
        by the replica that drives the run."""
        await self.known([handle])
        if handle in self.runs and self._elsewhere(handle):
            return await self._ask_remote(handle, "approve", {"allow": allow, "call": call_id})
        return await self.approvals.answer(handle, allow, call_id)

    # --- the agent loop (`driver`) ---

    def _background_task(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.driver.background_task(coro)

    def _run_span(self, spec: m.RunSpec, caller_trace: str | None) -> Span:
        parent = self.runs.get(spec.parent) if spec.parent is not None else None
        context = spans.parent_context(
            parent.span if parent is not None else None,
            parent.state.spec.traceparent if parent is not None else None,
            caller_trace,
        )
        return spans.start_run(spec, context)


async def _over(runs: list[Run], mode: str) -> None:
    """Return once all (or any) of the runs are over."""
    waits = [asyncio.ensure_future(r.done.wait()) for r in runs]
    try:
        when = asyncio.FIRST_COMPLETED if mode == "any" else asyncio.ALL_COMPLETED
        await asyncio.wait(waits, return_when=when)
    finally:
        for w in waits:
            w.cancel()


def _unwritable(why: str) -> JournalUnwritable:
    return JournalUnwritable(
        f"the runtime cannot write its journal ({why}): new runs are refused until it can; runs "
        "in progress go on to their next record and wait there"
    )


def new_handle() -> str:
    return f"run-{uuid.uuid4().hex[:16]}"
