"""The run state machine: one sub-agent run's lifecycle as a pure function of its events.

Pure module: no I/O, no clock reads, no awaits; imports only the standard library, `steps`,
`values` (whose types it re-exports) and `compaction`. The shell (`loop.runtime`) feeds it
events and carries out the decisions it returns; replay (`journal`) feeds it the same events
rebuilt from the journal, so a replayed run is the run that was journaled.

Theory of operation::

    spawn ──► RUNNING ──TurnCompleted(no tool calls)──► FINISHED
                 │  ▲
    TurnCompleted│  │ToolsReturned (a complete round: journaled, then the next turn)
    (tool calls) ▼  │
              TOOLS ─┘
    any live phase ──TurnFailed──► FAILED      any live phase ──Cancel──► CANCELLED

    TOOLS ──ApprovalAsked──► AWAITING_APPROVAL ──ApprovalDecided──► TOOLS
    TOOLS ──CallSending──► TOOLS (the call is out: `sent`)
    TOOLS ──CallReturned──► TOOLS (`returned`), or RUNNING once it was the round's last result
    RUNNING ──Compacted──► RUNNING (older rounds summarised or dropped before the turn: the
                           context wall, `compaction`; journaled)

A round is one assistant message with its tool calls plus every call's result. Each call is
journaled as it happens: the turn before the first of its calls is asked about, sent or
answered; each send before the request leaves; each result as it arrives (the round's last one
as the complete round); and every answer of the user. So a run rebuilt from the journal is
RUNNING (about to take a turn), TOOLS or AWAITING_APPROVAL with the answers given, the calls
sent and the results arrived so far, or over. A call sent but without its result is `sent`:
what happens to it is `resend`'s rule (send it again, ask again, or tell the model its outcome
is unknown), never a plain second send. A send uses up the user's yes for a call whose tool is
not idempotent (nor read-only), so such a call is asked about again before it is sent again; an
idempotent call's yes covers its sends again. Once `max_tool_calls` calls are spent the next
turn allows no calls (the shell still lists the tools, with tool_choice none, so the prompt's
start and the engine's cache of it stay); with `parallel_tool_calls` off only the first call of
a reply is kept.

Budgets are the subtree's (`budget`); a run only carries its limits and, once one is past,
`exceeded` (BudgetExceeded marks even a run that is over: its later children are refused).
Times (`at`, `spawned_at`) are wall-clock seconds given by the shell, never read here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from luftpause.runtime.core import compaction
from luftpause.runtime.core.steps import (
    ApprovalAsked,
    ApprovalDecided,
    BudgetExceeded,
    CallReturned,
    CallSending,
    CallTools,
    Cancel,
    Compacted,
    Decision,
    Event,
    Phase,
    RecordApproval,
    RecordCall,
    RecordCompacted,
    RecordExceeded,
    RecordFinished,
    RecordResult,
    RecordRound,
    RecordTurn,
    StartTurn,
    ToolsReturned,
    TurnCompleted,
    TurnFailed,
)
from luftpause.runtime.core.values import (
    BUDGET_KINDS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_TOOL_CALLS,
    SERVICE_CLASSES,
    Exceeded,
    RunSpec,
    Sent,
    ToolCall,
    ToolResult,
    Usage,
)

__all__ = [
    "BUDGET_KINDS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MAX_TOOL_CALLS",
    "SERVICE_CLASSES",
    "ApprovalAsked",
    "ApprovalDecided",
    "BudgetExceeded",
    "CallReturned",
    "CallSending",
    "CallTools",
    "Cancel",
    "Compacted",
    "Decision",
    "Event",
    "Exceeded",
    "Phase",
    "RecordApproval",
    "RecordCall",
    "RecordCompacted",
    "RecordExceeded",
    "RecordFinished",
    "RecordResult",
    "RecordRound",
    "RecordTurn",
    "RunSpec",
    "Sent",
    "StartTurn",
    "ToolCall",
    "ToolResult",
    "ToolsReturned",
    "TurnCompleted",
    "TurnFailed",
    "Usage",
]


# --- state ---


@dataclass(frozen=True, slots=True, kw_only=True)
class RunState:
    spec: RunSpec
    phase: Phase = Phase.RUNNING
    messages: tuple[dict[str, Any], ...] = ()
    rounds: int = 0
    tool_calls: int = 0
    failed_tool_calls: int = 0
    tool_seconds: float = 0.0
    usage: Usage = field(default_factory=Usage)
    pending: tuple[ToolCall, ...] = ()
    pending_usage: Usage = field(default_factory=Usage)
    pending_content: str | None = None
    result: str | None = None
    error: str | None = None
    ended_at: float | None = None
    exceeded: Exceeded | None = None
    approvals: tuple[tuple[str, bool], ...] = ()
    asking: str | None = None
    turn_recorded: bool = False
    # The round in progress: calls sent whose result has not arrived, and results arrived.
    sent: tuple[Sent, ...] = ()
    returned: tuple[ToolResult, ...] = ()

    @property
    def tools_left(self) -> int:
        return max(0, self.spec.max_tool_calls - self.tool_calls)

    def approval(self, call_id: str) -> bool | None:
        """The user's answer about a pending call, None if not asked (or not answered)."""
        return next((allow for cid, allow in self.approvals if cid == call_id), None)

    def sent_call(self, call_id: str) -> Sent | None:
        """The pending call as sent, if it was and its result has not arrived."""
        return next((x for x in self.sent if x.call_id == call_id), None)

    def result_of(self, call_id: str) -> ToolResult | None:
        """The pending call's result, if it arrived."""
        return next((r for r in self.returned if r.call_id == call_id), None)


def start(spec: RunSpec) -> RunState:
    """A freshly spawned run: the system prompt (if any) and the task."""
    messages: list[dict[str, Any]] = []
    if spec.system:
        messages.append({"role": "system", "content": spec.system})
    messages.append({"role": "user", "content": spec.task})
    return RunState(spec=spec, messages=tuple(messages))


def next_decision(state: RunState) -> StartTurn | CallTools | None:
    """What the shell does next for a live run; None once it is over."""
    if state.phase is Phase.RUNNING:
        return StartTurn(messages=state.messages, offer_tools=state.tools_left > 0)
    if state.phase in (Phase.TOOLS, Phase.AWAITING_APPROVAL):
        return CallTools(calls=tuple(c for c in state.pending if state.result_of(c.id) is None))
    return None


def step(state: RunState, event: Event) -> tuple[RunState, tuple[Decision, ...]]:
    """Apply one event; return the new state and what the shell must do now."""
    if isinstance(event, BudgetExceeded):
        if state.exceeded is not None:
            return state, ()
        return replace(state, exceeded=event.exceeded), (RecordExceeded(exceeded=event.exceeded),)
    if state.phase.over:
        return state, ()
    if isinstance(event, Cancel):
        return _end(state, Phase.CANCELLED, None, event.reason, at=event.at)
    if isinstance(event, TurnFailed):
        return _end(state, Phase.FAILED, None, event.error, at=event.at)
    if isinstance(event, TurnCompleted):
        return _turn_completed(state, event)
    if isinstance(event, ApprovalAsked):
        return _approval_asked(state, event)
    if isinstance(event, ApprovalDecided):
        return _approval_decided(state, event)
    if isinstance(event, Compacted):
        return _compacted(state, event)
    if isinstance(event, CallSending):
        return _call_sending(state, event)
    if isinstance(event, CallReturned):
        return _call_returned(state, event)
    return _tools_returned(state, event)


def _end(
    state: RunState,
    phase: Phase,
    result: str | None,
    error: str | None,
    usage: Usage | None = None,
    at: float = 0.0,
) -> tuple[RunState, tuple[Decision, ...]]:
    usage = usage or Usage()
    new = replace(
        state,
        phase=phase,
        result=result,
        error=error,
        pending=(),
        usage=state.usage + usage,
        ended_at=at,
        asking=None,
        approvals=(),
        sent=(),
        returned=(),
    )
    return new, (RecordFinished(phase=phase, result=result, error=error, usage=usage, at=at),)


def _turn_completed(state: RunState, event: TurnCompleted) -> tuple[RunState, tuple[Decision, ...]]:
    if state.phase is not Phase.RUNNING:
        raise ValueError(f"a turn completed while the run is {state.phase}")
    calls = event.tool_calls[: state.tools_left]
    if calls and not state.spec.parallel_tool_calls:
        calls = calls[:1]
    if not calls:
        return _end(state, Phase.FINISHED, event.content or "", None, event.usage, at=event.at)
    new = replace(
        state,
        phase=Phase.TOOLS,
        pending=calls,
        pending_usage=event.usage,
        pending_content=event.content,
    )
    return new, (CallTools(calls=calls),)


def assistant_message(content: str | None, calls: tuple[ToolCall, ...]) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": [c.to_json() for c in calls]}


def _turn_first(state: RunState, asking: str | None = None) -> tuple[Decision, ...]:
    """The turn's record, when none of its calls has been journaled yet."""
    if state.turn_recorded:
        return ()
    record = RecordTurn(
        round=state.rounds + 1,
        assistant=assistant_message(state.pending_content, state.pending),
        usage=state.pending_usage,
        asking=asking,
    )
    return (record,)


def _approval_asked(state: RunState, event: ApprovalAsked) -> tuple[RunState, tuple[Decision, ...]]:
    if state.phase is Phase.AWAITING_APPROVAL and state.asking == event.call_id:
        return state, ()  # asked again after a restart: the question is journaled already
    if state.phase is not Phase.TOOLS:
        raise ValueError(f"an approval was asked while the run is {state.phase}")
    call = _pending_call(state, event.call_id)
    new = replace(state, phase=Phase.AWAITING_APPROVAL, asking=call.id, turn_recorded=True)
    return new, _turn_first(state, asking=call.id)


def _approval_decided(
    state: RunState, event: ApprovalDecided
) -> tuple[RunState, tuple[Decision, ...]]:
    if state.phase not in (Phase.TOOLS, Phase.AWAITING_APPROVAL):
        raise ValueError(f"an approval was decided while the run is {state.phase}")
    call = _pending_call(state, event.call_id)
    new = replace(
        state,
        phase=Phase.TOOLS,
        asking=None,
        approvals=(*state.approvals, (call.id, event.allow)),
    )
    return new, (RecordApproval(call_id=call.id, tool=call.name, allow=event.allow),)


def _pending_call(state: RunState, call_id: str) -> ToolCall:
    call = _unreturned_call(state, call_id)
    if state.approval(call_id) is not None:
        raise ValueError(f"tool call {call_id} was already decided")
    return call


def _unreturned_call(state: RunState, call_id: str) -> ToolCall:
    call = next((c for c in state.pending if c.id == call_id), None)
    if call is None:
        raise ValueError(f"no pending tool call {call_id}")
    if state.result_of(call_id) is not None:
        raise ValueError(f"tool call {call_id} has its result already")
    return call


def _call_sending(state: RunState, event: CallSending) -> tuple[RunState, tuple[Decision, ...]]:
    if state.phase not in (Phase.TOOLS, Phase.AWAITING_APPROVAL):
        raise ValueError(f"a tool call was sent while the run is {state.phase}")
    call = _unreturned_call(state, event.call_id)
    if event.approval and state.approval(call.id) is not True:
        raise ValueError(f"tool call {call.id} needs the user's yes before it is sent")
    before = state.sent_call(call.id)
    sent = Sent(
        call_id=call.id,
        attempts=1 if before is None else before.attempts + 1,
        resendable=event.resendable,
        approval=event.approval,
    )
    approvals = state.approvals
    if not event.resendable:  # sent again after an unknown outcome, it is asked about again
        approvals = tuple(a for a in state.approvals if a[0] != call.id)
    new = replace(
        state,
        sent=(*(x for x in state.sent if x.call_id != call.id), sent),
        approvals=approvals,
        turn_recorded=True,
    )
    return new, (*_turn_first(state), RecordCall(call=call, sent=sent))


def _call_returned(state: RunState, event: CallReturned) -> tuple[RunState, tuple[Decision, ...]]:
    if state.phase not in (Phase.TOOLS, Phase.AWAITING_APPROVAL):
        raise ValueError(f"a tool result arrived while the run is {state.phase}")
    result = event.result
    call = _unreturned_call(state, result.call_id)
    returned = (*state.returned, result)
    if len(returned) == len(state.pending):  # the round's last result: the round is complete
        return _tools_returned(replace(state, phase=Phase.TOOLS), ToolsReturned(results=returned))
    new = replace(
        state,
        sent=tuple(x for x in state.sent if x.call_id != call.id),
        returned=returned,
        turn_recorded=True,
    )
    return new, (*_turn_first(state), RecordResult(result=result))


def _compacted(state: RunState, event: Compacted) -> tuple[RunState, tuple[Decision, ...]]:
    if state.phase is not Phase.RUNNING:
        raise ValueError(f"a history was compacted while the run is {state.phase}")
    head = len(start(state.spec).messages)
    first = compaction.split(state.messages, head=head, rounds=state.rounds).first
    messages = compaction.replaced(
        state.messages, head=head, rounds=state.rounds, through=event.through, summary=event.summary
    )
    new = replace(state, messages=messages, usage=state.usage + event.usage)
    return new, (RecordCompacted(compacted=event, first=first),)


def _tools_returned(state: RunState, event: ToolsReturned) -> tuple[RunState, tuple[Decision, ...]]:
    if state.phase is not Phase.TOOLS:
        raise ValueError(f"tool results arrived while the run is {state.phase}")
    by_id = {r.call_id: r for r in event.results}
    if set(by_id) != {c.id for c in state.pending}:
        raise ValueError("a round needs exactly one result per pending tool call")
    results = tuple(by_id[c.id] for c in state.pending)
    assistant = assistant_message(state.pending_content, state.pending)
    tool_messages = [
        {"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in results
    ]
    new = replace(
        state,
        phase=Phase.RUNNING,
        messages=(*state.messages, assistant, *tool_messages),
        rounds=state.rounds + 1,
        tool_calls=state.tool_calls + len(results),
        failed_tool_calls=state.failed_tool_calls + sum(1 for r in results if not r.ok),
        tool_seconds=state.tool_seconds + sum(r.seconds for r in results),
        usage=state.usage + state.pending_usage,
        pending=(),
        pending_usage=Usage(),
        pending_content=None,
        approvals=(),
        turn_recorded=False,
        sent=(),
        returned=(),
    )
    record = RecordRound(
        round=new.rounds, assistant=assistant, results=results, usage=state.pending_usage
    )
    return new, (record,)


def summary(state: RunState) -> dict[str, Any]:
    """What `await` and `status` say about a run."""
    out: dict[str, Any] = {
        "handle": state.spec.handle,
        "state": state.phase.value,
        "result": state.result,
        "toolCalls": state.tool_calls,
        "failedToolCalls": state.failed_tool_calls,
        "turns": state.usage.turns,
    }
    if state.error is not None:
        out["error"] = state.error
    if state.phase is Phase.AWAITING_APPROVAL and state.asking is not None:
        call = next(c for c in state.pending if c.id == state.asking)
        out["pendingApproval"] = {"tool": call.name, "arguments": _arguments(call.arguments)}
    if state.spec.parent is not None:
        out["parent"] = state.spec.parent
    return out


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def canonical(state: RunState) -> str:
    """A stable text form of a state, for golden-journal comparisons."""
    data = summary(state) | {
        "rounds": state.rounds,
        "messages": list(state.messages),
        "usage": {
            "turns": state.usage.turns,
            "promptTokens": state.usage.prompt_tokens,
            "completionTokens": state.usage.completion_tokens,
        },
    }
    if state.exceeded is not None:
        data["exceeded"] = state.exceeded.to_json()
    if state.approvals:
        data["approvals"] = [list(a) for a in state.approvals]
    if state.sent:
        data["sent"] = [
            {"call": x.call_id, "attempts": x.attempts, "resendable": x.resendable}
            | ({"approval": True} if x.approval else {})
            for x in state.sent
        ]
    if state.returned:
        data["returned"] = [{"call": r.call_id, "ok": r.ok} for r in state.returned]
    return json.dumps(data, sort_keys=True)
