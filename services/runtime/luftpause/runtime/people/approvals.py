"""The tool calls waiting for a person's yes, of the runs driven here.

Shell module (asyncio futures and events). A round's call that needs approval (`rounds`) waits on
a future that `answer` resolves (the `approve` tool, an answer given to an elicitation or to a
task, `elicitation`); the answer is journaled as the run's `ApprovalDecided` step before the call
runs or is declined, and `answer` returns only once it is. The approval is open before the run
shows AwaitingApproval, so a client that sees that state while the journal write is still under
way can answer at once. One question at a time per run: the calls of a round settle concurrently
and may ask again.

Whom to ask when is `question_gate`'s; this module knows a run only as something with a state
machine's state, the approval it waits for and its asking lock (`Asking`), and the runtime only
through the callback that steps a run and journals the step (`Apply`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import structlog

from luftpause.runtime.core import budget
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.errors import RequestError

log = structlog.get_logger(service="runtime")


@dataclass(eq=False)
class Approval:
    """A tool call waiting for the user: `answer` resolves it, `journaled` once it is on disk."""

    call: m.ToolCall
    answer: asyncio.Future[bool]
    journaled: asyncio.Event = field(default_factory=asyncio.Event)
    since: float = 0.0  # when the run began to wait (wall clock): questions go oldest first


class Asking(Protocol):
    """A run as approvals see it: its state, the approval it waits for, its asking lock."""

    approval: Approval | None

    @property
    def state(self) -> m.RunState: ...

    @property
    def asking(self) -> asyncio.Lock: ...


R = TypeVar("R", bound=Asking)
Apply = Callable[[R, m.Event], Awaitable[None]]  # step the run's state and journal the step


class Approvals(Generic[R]):
    """Every approval the runs driven here wait for; one per runtime."""

    def __init__(self, runs: Mapping[str, R], apply: Apply[R], clock: Callable[[], float]) -> None:
        self._runs = runs
        self._apply = apply
        self._clock = clock
        self._waiters: set[asyncio.Event] = set()

    async def ask(self, run: R, call: m.ToolCall) -> bool:
        """Wait for the user's answer about one call; journal it; return it."""
        async with run.asking:
            pending = Approval(
                call=call, answer=asyncio.get_running_loop().create_future(), since=self._clock()
            )
            run.approval = pending
            try:
                await self._apply(run, m.ApprovalAsked(call_id=call.id))
                log.info("run.awaiting_approval", run=run.state.spec.handle, tool=call.name)
                for event in self._waiters:
                    event.set()
                allow = await pending.answer
                await self._apply(run, m.ApprovalDecided(call_id=call.id, allow=allow))
            finally:
                run.approval = None
                pending.journaled.set()
            return allow

    async def answer(self, handle: str, allow: bool, call_id: str | None = None) -> dict[str, Any]:
        """Answer the pending approval of a run driven here; returns once it is journaled."""
        run = self._runs.get(handle)
        if run is None:
            raise RequestError(f"no run {handle}")
        pending = run.approval
        if pending is None or pending.answer.done():
            raise RequestError(f"run {handle} is not waiting for an approval")
        if call_id is not None and pending.call.id != call_id:
            raise RequestError(f"run {handle} is not waiting for tool call {call_id}")
        pending.answer.set_result(allow)
        await pending.journaled.wait()
        return {"handle": handle, "tool": pending.call.name, "allow": allow}

    def pending(self, handles: list[str]) -> list[tuple[str, Approval]]:
        """Unanswered approvals of the runs and everything below them, oldest first."""
        kids = budget.children(self._runs)
        covered = {h for top in handles if top in self._runs for h in budget.subtree(top, kids)}
        pending = [
            (h, a)
            for h in covered
            if (a := self._runs[h].approval) is not None and not a.answer.done()
        ]
        return sorted(pending, key=lambda p: (p[1].since, p[0]))

    @contextmanager
    def watch(self) -> Iterator[asyncio.Event]:
        """An event set whenever any run starts waiting for an approval."""
        event = asyncio.Event()
        self._waiters.add(event)
        try:
            yield event
        finally:
            self._waiters.discard(event)
