"""A run's turn behind the context wall: before it, compact the run's history if the turn would
not fit the model's context window; after an engine refused a prompt as too long, compact and
let the run try again (failing only when nothing is left to replace). What to replace is
`compaction`'s; the outcome is a `machine.Compacted` event the run applies and journals, so a
replay restores the compacted history without a second summary.

Shell module: model calls through `llm.Llm`. The summary is one call on the run's behalf, through
the dataplane with the run's handle (scheduled and counted as its turns are, its tokens in the
run's usage and budgets), its prompt the run's own history up to the rounds it replaces, tools
included, so the engine's prefix cache serves it.
Each model's context window is `windows`'.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import structlog

from luftpause.runtime.context.windows import Windows, parse_window
from luftpause.runtime.core import compaction
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.errors import ContextOverflow, TurnError
from luftpause.runtime.loop.llm import Llm

DEFAULT_RESERVE = 256  # a turn without max_tokens: what engines commonly reserve

log = structlog.get_logger(service="runtime")


def reserve(spec: m.RunSpec) -> int:
    """The reply tokens a turn of the run reserves."""
    return spec.max_tokens or DEFAULT_RESERVE


class ContextWall:
    """Compactions of runs' histories; one per runtime."""

    def __init__(
        self,
        llm: Llm,
        windows: Windows | None = None,
        *,
        keep_rounds: int = compaction.DEFAULT_KEEP_ROUNDS,
        summary_tokens: int = compaction.DEFAULT_SUMMARY_TOKENS,
        on_compacted: Callable[[str], None] | None = None,
    ) -> None:
        if keep_rounds < 0 or summary_tokens < 1:
            raise ValueError("keep_rounds must be >= 0 and summary_tokens >= 1")
        self.llm = llm
        self.windows = Windows() if windows is None else windows  # none: learned ones only
        self.keep_rounds = keep_rounds
        self.summary_tokens = summary_tokens
        self._reported: dict[str, compaction.Reported] = {}
        self.on_compacted = on_compacted  # the metrics' counter, by outcome

    def turned(self, state: m.RunState, sent: tuple[dict[str, Any], ...], usage: m.Usage) -> None:
        """A turn of the run was answered: the engine's count of its prompt and reply."""
        self._reported[state.spec.handle] = compaction.Reported(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            sent=sent,
        )

    def forget(self, handle: str) -> None:
        self._reported.pop(handle, None)

    def estimate(self, state: m.RunState, tools: Sequence[Any]) -> int:
        reported = self._reported.get(state.spec.handle)
        return compaction.estimate(state.messages, tools, reported)

    async def turn(
        self,
        state: m.RunState,
        decision: m.StartTurn,
        tools: list[dict[str, Any]],
        clock: Callable[[], float],
    ) -> m.Event:
        """The run's next turn as the event it ends in; or the compaction that comes first."""
        try:
            compacted = await self.before_turn(state, tools)
            if compacted is not None:
                return compacted
            turn = await self.llm.turn(
                state.spec, decision.messages, tools, calls=decision.offer_tools
            )
        except ContextOverflow as exc:
            compacted = await self.overflowed(state, tools, exc)
            return compacted or m.TurnFailed(error=str(exc), at=clock())
        except TurnError as exc:
            return m.TurnFailed(error=str(exc), at=clock())
        self.turned(state, decision.messages, turn.usage)
        return replace(turn, at=clock())

    async def before_turn(self, state: m.RunState, tools: Sequence[Any]) -> m.Compacted | None:
        """The compaction the run's next turn needs first, if it would not fit."""
        window = await self.windows.of(state.spec.model)
        tokens = self.estimate(state, tools)
        if window is None or compaction.fits(tokens, reserve(state.spec), window):
            return None
        return await self._compact(state, tools, window, tokens)

    async def overflowed(
        self, state: m.RunState, tools: Sequence[Any], error: ContextOverflow
    ) -> m.Compacted | None:
        """The compaction after the engine refused the turn; None when nothing is left to
        replace (the run fails with the error)."""
        if error.window is not None:
            self.windows.learn(state.spec.model, error.window)
        window = await self.windows.of(state.spec.model)
        return await self._compact(state, tools, window, self.estimate(state, tools))

    async def _compact(
        self, state: m.RunState, tools: Sequence[Any], window: int | None, tokens: int
    ) -> m.Compacted | None:
        spec = state.spec
        head = len(m.start(spec).messages)
        history = compaction.split(state.messages, head=head, rounds=state.rounds)
        plan = compaction.plan(
            history, tools, window=window, keep=self.keep_rounds, wanted_summary=self.summary_tokens
        )
        if plan is None:
            return None
        summary, usage = await self._summary(spec, plan, tools)
        if summary is not None:
            after = compaction.replaced(
                state.messages,
                head=head,
                rounds=state.rounds,
                through=plan.through,
                summary=summary,
            )
            size = compaction.text_tokens(after, tools)
            # A partial summary that shrank the history goes in: the next look compacts more.
            shrank = not plan.whole and size < compaction.text_tokens(state.messages, tools)
            if compaction.fits(size, reserve(spec), window) or shrank:
                log.info("run.compacted", run=spec.handle, through=plan.through, window=window)
                self._count("summarised")
                return m.Compacted(
                    through=plan.through,
                    summary=summary,
                    usage=usage,
                    window=window,
                    estimate=tokens,
                )
            log.warning("run.summary_too_long", run=spec.handle, window=window)
        through = compaction.truncation(
            history, tools, window=window, reserve=reserve(spec), keep=self.keep_rounds
        )
        assert through is not None  # a plan means there are rounds to drop
        log.warning("run.truncated", run=spec.handle, through=through, window=window)
        self._count("truncated")
        return m.Compacted(
            through=through, summary=None, usage=usage, window=window, estimate=tokens
        )

    def _count(self, outcome: str) -> None:
        if self.on_compacted is not None:
            self.on_compacted(outcome)

    async def _summary(
        self, spec: m.RunSpec, plan: compaction.Plan, tools: Sequence[Any]
    ) -> tuple[str | None, m.Usage]:
        """One model call for the summary; None (and what it cost) when it cannot be made."""
        if plan.request is None:
            log.warning("run.summary_does_not_fit", run=spec.handle)
            return None, m.Usage()
        asking = replace(spec, max_tokens=plan.summary_tokens)
        try:
            turn = await self.llm.turn(asking, plan.request, list(tools), calls=False)
        except TurnError as exc:
            log.warning("run.summary_failed", run=spec.handle, error=str(exc))
            return None, m.Usage()
        text = (turn.content or "").strip()
        return (text or None), replace(turn.usage, turns=0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`luftpause runtime`'s flags for the context wall."""
    p.add_argument(
        "--context-window",
        action="append",
        default=[],
        type=_window_arg,
        metavar="[MODEL=]TOKENS",
        help="a model's context window in tokens (MODEL=N), or every model's (N) where the "
        "engine does not say; a run's history is compacted before a turn that would not fit; "
        "repeatable",
    )
    p.add_argument(
        "--keep-rounds",
        type=_at_least(0),
        default=compaction.DEFAULT_KEEP_ROUNDS,
        metavar="K",
        help="a compaction keeps a run's last K tool rounds verbatim and summarises the older ones",
    )
    p.add_argument(
        "--summary-tokens",
        type=_at_least(1),
        default=compaction.DEFAULT_SUMMARY_TOKENS,
        metavar="N",
        help="max_tokens of a compaction's summary call (at most a quarter of the window)",
    )


def _window_arg(text: str) -> tuple[str | None, int]:
    try:
        return parse_window(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _at_least(low: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return convert
