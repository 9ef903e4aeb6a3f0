"""The run state machine: one sub-agent run's lifecycle as a pure function of its events.

Pure module: no I/O, no clock reads, no awaits; imports only the standard library. The shell
(`agent`) feeds it events and carries out the decisions it returns; replay (`journal`) feeds it
the same events rebuilt from the journal, so a replayed run is the run that was journaled.

Theory of operation::

    spawn ──► RUNNING ──TurnCompleted(no tool calls)──► FINISHED
                 │  ▲
    TurnCompleted│  │ToolsReturned (a complete round: journaled, then the next turn)
    (tool calls) ▼  │
              TOOLS ─┘
    any live phase ──TurnFailed──► FAILED      any live phase ──Cancel──► CANCELLED

A round is one assistant message with its tool calls plus every call's result. Only complete
rounds are journaled, so a run rebuilt from the journal is always RUNNING (about to take a turn)
or over. Once `max_tool_calls` calls are spent the next turn offers no tools; with
`parallel_tool_calls` off only the first call of a reply is kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

DEFAULT_MAX_TOOL_CALLS = 8
DEFAULT_MAX_TOKENS = 256
SERVICE_CLASSES = ("interactive", "batch")


class Phase(StrEnum):
    RUNNING = "running"
    TOOLS = "tools"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def over(self) -> bool:
        return self in (Phase.FINISHED, Phase.FAILED, Phase.CANCELLED)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    """Everything `spawn` said about a run, plus who asked (the caller)."""

    handle: str
    task: str
    model: str
    service_class: str = "interactive"
    system: str | None = None
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS
    tools: tuple[str, ...] | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    parallel_tool_calls: bool = False
    parent: str | None = None
    caller: str = "mcp"

    def __post_init__(self) -> None:
        if not self.handle or not self.task or not self.model:
            raise ValueError("handle, task and model must not be empty")
        if self.service_class not in SERVICE_CLASSES:
            raise ValueError(f"serviceClass must be one of {SERVICE_CLASSES}")
        if self.max_tool_calls < 0 or self.max_tokens < 0:
            raise ValueError("maxToolCalls and maxTokens must be at least 0")

    def to_json(self) -> dict[str, Any]:
        return {
            "handle": self.handle,
            "task": self.task,
            "model": self.model,
            "serviceClass": self.service_class,
            "system": self.system,
            "maxToolCalls": self.max_tool_calls,
            "tools": None if self.tools is None else list(self.tools),
            "maxTokens": self.max_tokens,
            "parallelToolCalls": self.parallel_tool_calls,
            "parent": self.parent,
            "caller": self.caller,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSpec:
        tools = data.get("tools")
        return cls(
            handle=str(data["handle"]),
            task=str(data["task"]),
            model=str(data["model"]),
            service_class=str(data.get("serviceClass", "interactive")),
            system=data.get("system"),
            max_tool_calls=int(data.get("maxToolCalls", DEFAULT_MAX_TOOL_CALLS)),
            tools=None if tools is None else tuple(str(t) for t in tools),
            max_tokens=int(data.get("maxTokens", DEFAULT_MAX_TOKENS)),
            parallel_tool_calls=bool(data.get("parallelToolCalls", False)),
            parent=data.get("parent"),
            caller=str(data.get("caller", "mcp")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One call the model asked for; `arguments` is the model's raw JSON text."""

    id: str
    name: str
    arguments: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """What one tool call returned (or why it failed: `ok` false)."""

    call_id: str
    name: str
    content: str
    ok: bool = True
    seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Work done by one turn (or summed over several)."""

    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    turn_seconds: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            turns=self.turns + other.turns,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            turn_seconds=self.turn_seconds + other.turn_seconds,
        )


# --- events ---


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnCompleted:
    """The model answered: text and/or tool calls."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolsReturned:
    """Every pending call of the round has its result."""

    results: tuple[ToolResult, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFailed:
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel:
    reason: str = "cancelled"


Event = TurnCompleted | ToolsReturned | TurnFailed | Cancel


# --- decisions ---


@dataclass(frozen=True, slots=True, kw_only=True)
class StartTurn:
    """Ask the model for the next turn; `offer_tools` false once the budget is spent."""

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
class RecordFinished:
    """Journal the outcome, report the run over to the dataplane, wake its awaiters."""

    phase: Phase
    result: str | None
    error: str | None
    usage: Usage = field(default_factory=Usage)


Decision = StartTurn | CallTools | RecordRound | RecordFinished


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

    @property
    def tools_left(self) -> int:
        return max(0, self.spec.max_tool_calls - self.tool_calls)


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
    if state.phase is Phase.TOOLS:
        return CallTools(calls=state.pending)
    return None


def step(state: RunState, event: Event) -> tuple[RunState, tuple[Decision, ...]]:
    """Apply one event; return the new state and what the shell must do now."""
    if state.phase.over:
        return state, ()
    if isinstance(event, Cancel):
        return _end(state, Phase.CANCELLED, None, event.reason)
    if isinstance(event, TurnFailed):
        return _end(state, Phase.FAILED, None, event.error)
    if isinstance(event, TurnCompleted):
        return _turn_completed(state, event)
    return _tools_returned(state, event)


def _end(
    state: RunState,
    phase: Phase,
    result: str | None,
    error: str | None,
    usage: Usage | None = None,
) -> tuple[RunState, tuple[Decision, ...]]:
    usage = usage or Usage()
    new = replace(
        state, phase=phase, result=result, error=error, pending=(), usage=state.usage + usage
    )
    return new, (RecordFinished(phase=phase, result=result, error=error, usage=usage),)


def _turn_completed(state: RunState, event: TurnCompleted) -> tuple[RunState, tuple[Decision, ...]]:
    if state.phase is not Phase.RUNNING:
        raise ValueError(f"a turn completed while the run is {state.phase}")
    calls = event.tool_calls[: state.tools_left]
    if calls and not state.spec.parallel_tool_calls:
        calls = calls[:1]
    if not calls:
        return _end(state, Phase.FINISHED, event.content or "", None, event.usage)
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
    if state.spec.parent is not None:
        out["parent"] = state.spec.parent
    return out


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
    return json.dumps(data, sort_keys=True)
