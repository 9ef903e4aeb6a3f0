"""What a run's state machine takes in and gives out: its phases, events and decisions.

Pure module: frozen values only, no I/O. `machine` consumes the events and returns the
decisions (and re-exports all of them); the run loop (`loop.runtime`) and `journal` build them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from luftpause.runtime.core.values import Exceeded, Sent, ToolCall, ToolResult, Usage


class Phase(StrEnum):
    RUNNING = "running"
    TOOLS = "tools"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    AWAITING_APPROVAL = "AwaitingApproval"

    @property
    def over(self) -> bool:
        return self in (Phase.FINISHED, Phase.FAILED, Phase.CANCELLED)


# --- events ---


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnCompleted:
    """The model answered: text and/or tool calls."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolsReturned:
    """Every pending call of the round has its result."""

    results: tuple[ToolResult, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSending:
    """The shell is about to send pending call `call_id` (again): journaled before it leaves.
    `resendable` and `approval` are what was known of its tool then (`values.Sent`)."""

    call_id: str
    resendable: bool = False
    approval: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CallReturned:
    """One pending call has its result (from its server, or the shell's own: declined, unknown
    tool, bad arguments, outcome unknown)."""

    result: ToolResult


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFailed:
    error: str
    at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel:
    reason: str = "cancelled"
    at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalAsked:
    """The shell is about to ask the user whether pending call `call_id` may run."""

    call_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecided:
    call_id: str
    allow: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetExceeded:
    """This run's budget is past a limit; the shell cancels its subtree next."""

    exceeded: Exceeded


@dataclass(frozen=True, slots=True, kw_only=True)
class Compacted:
    """Before a turn: the history's rounds up to `through` replaced by `summary` (None: dropped,
    see `compaction`); `usage` is the summary call's. `window` and `estimate` (tokens) say why."""

    through: int
    summary: str | None
    usage: Usage = field(default_factory=Usage)
    window: int | None = None
    estimate: int = 0

    def __post_init__(self) -> None:
        if self.through < 1 or self.estimate < 0 or (self.window is not None and self.window < 1):
            raise ValueError("a compaction replaces round 1 on, with a window >= 1 if any")


Event = (
    TurnCompleted
    | ToolsReturned
    | CallSending
    | CallReturned
    | TurnFailed
    | Cancel
    | ApprovalAsked
    | ApprovalDecided
    | BudgetExceeded
    | Compacted
)


# --- decisions ---


@dataclass(frozen=True, slots=True, kw_only=True)
class StartTurn:
    """Ask the model for the next turn; `offer_tools` false once the calls are spent (the tools
    are still listed, with tool_choice none: see `machine`)."""

    messages: tuple[dict[str, Any], ...]
    offer_tools: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CallTools:
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordRound:
    """Journal this complete round before the next turn starts."""

    round: int
    assistant: dict[str, Any]
    results: tuple[ToolResult, ...]
    usage: Usage


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordCall:
    """Journal that a call is about to be sent (its `attempts`-th send), before it leaves."""

    call: ToolCall
    sent: Sent


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordResult:
    """Journal one call's result while other calls of its round are still out."""

    result: ToolResult


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordFinished:
    """Journal the outcome, report the run over to the dataplane, wake its awaiters."""

    phase: Phase
    result: str | None
    error: str | None
    usage: Usage = field(default_factory=Usage)
    at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordTurn:
    """Journal a turn with tool calls before the first of its calls is asked about, sent or
    answered, so a restart goes on with the same calls; `asking` is the call asked about, if
    that came first."""

    round: int
    assistant: dict[str, Any]
    usage: Usage
    asking: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordApproval:
    call_id: str
    tool: str
    allow: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordExceeded:
    exceeded: Exceeded


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordCompacted:
    """Journal a compaction of the history before the turn it makes room for; `first` is the
    oldest round it replaced (with any summary before it)."""

    compacted: Compacted
    first: int


Decision = (
    StartTurn
    | CallTools
    | RecordRound
    | RecordFinished
    | RecordTurn
    | RecordCall
    | RecordResult
    | RecordApproval
    | RecordExceeded
    | RecordCompacted
)
