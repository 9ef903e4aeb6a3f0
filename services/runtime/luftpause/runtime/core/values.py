"""The values a run is made of: what spawn asked for, tool calls (and which were sent) and
results, usage, and a budget's excess.

Pure module: no I/O; standard library and `price` only. Frozen, and each checks its input when
built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from luftpause.runtime.core.price import Price

DEFAULT_MAX_TOOL_CALLS = 8
DEFAULT_MAX_TOKENS = 256
SERVICE_CLASSES = ("interactive", "batch")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    """Everything `spawn` said about a run, plus who asked (the caller, and the key)."""

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
    budget_tokens: int | None = None
    budget_tool_calls: int | None = None
    budget_seconds: float | None = None
    approve_tools: tuple[str, ...] = ()
    spawned_at: float = 0.0
    # The W3C traceparent of the run's `invoke_agent` span, when the runtime traces (`spans`).
    traceparent: str | None = None
    # The name of the keys file's key the run belongs to (the one that spawned it, or its
    # parent's): its turns go to the dataplane on behalf of that key. None without keys.
    key: str | None = None
    # spawn's budgetUsd, and the price of the run's model when the runtime has one for it
    # (`price_table`): frozen at spawn, so a replayed run costs what it cost.
    budget_usd: float | None = None
    price: Price | None = None

    def __post_init__(self) -> None:
        if not self.handle or not self.task or not self.model:
            raise ValueError("handle, task and model must not be empty")
        if self.service_class not in SERVICE_CLASSES:
            raise ValueError(f"serviceClass must be one of {SERVICE_CLASSES}")
        if self.max_tool_calls < 0 or self.max_tokens < 0:
            raise ValueError("maxToolCalls and maxTokens must be at least 0")
        for name, value in (
            ("budgetTokens", self.budget_tokens),
            ("budgetToolCalls", self.budget_tool_calls),
            ("budgetSeconds", self.budget_seconds),
            ("budgetUsd", self.budget_usd),
        ):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be at least 0")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
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
            "budgetTokens": self.budget_tokens,
            "budgetToolCalls": self.budget_tool_calls,
            "budgetSeconds": self.budget_seconds,
            "approveTools": list(self.approve_tools),
            "spawnedAt": self.spawned_at,
        }
        if self.traceparent is not None:  # optional in format 1: specs without it read as None
            out["traceparent"] = self.traceparent
        if self.key is not None:  # optional in format 1 likewise
            out["key"] = self.key
        if self.budget_usd is not None:  # optional in format 1 likewise
            out["budgetUsd"] = self.budget_usd
        if self.price is not None:  # optional in format 1 likewise
            out["price"] = self.price.to_json()
        return out

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
            budget_tokens=_opt_int(data.get("budgetTokens")),
            budget_tool_calls=_opt_int(data.get("budgetToolCalls")),
            budget_seconds=_opt_float(data.get("budgetSeconds")),
            approve_tools=tuple(str(t) for t in data.get("approveTools") or ()),
            spawned_at=float(data.get("spawnedAt", 0.0)),
            traceparent=_opt_str(data.get("traceparent")),
            key=_opt_str(data.get("key")),
            budget_usd=_opt_float(data.get("budgetUsd")),
            price=None if data.get("price") is None else Price.from_json(data["price"]),
        )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


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
class Sent:
    """A call of the round in progress that was sent, its result not (yet) journaled: how many
    times it was sent and what was known of its tool then (`resend`'s rule reads it)."""

    call_id: str
    attempts: int = 1
    # The tool declared idempotentHint or readOnlyHint: sending it again is harmless.
    resendable: bool = False
    # The call needed the user's approval (each send uses up one yes).
    approval: bool = False

    def __post_init__(self) -> None:
        if not self.call_id or self.attempts < 1:
            raise ValueError("a sent call has an id and was sent at least once")


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Work done by one turn (or summed over several)."""

    turns: int = 0
    prompt_tokens: int = 0
    # Of the prompt tokens, those the engine served from its prefix cache (when it says).
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    turn_seconds: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            turns=self.turns + other.turns,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens + other.cached_prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            turn_seconds=self.turn_seconds + other.turn_seconds,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Exceeded:
    """Which limit of a subtree's budget was passed, and by how much."""

    which: str
    used: float
    limit: float
    # Seconds only: the next turn's predicted seconds, when the run stopped before a turn it
    # could not finish within the limit (`used` is then the time spent before it).
    predicted: float | None = None

    def __post_init__(self) -> None:
        if self.which not in BUDGET_KINDS:
            raise ValueError(f"budget kind must be one of {BUDGET_KINDS}")
        if self.predicted is not None and self.which != "seconds":
            raise ValueError("only a seconds budget is tripped by a prediction")

    @property
    def reason(self) -> str:
        used, limit = _num(self.used, self.which), _num(self.limit, self.which)
        if self.predicted is not None:
            turn = _num(self.predicted, self.which)
            return f"budget exceeded: {self.which} (predicted) {used}+{turn}/{limit}"
        return f"budget exceeded: {self.which} {used}/{limit}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"which": self.which, "used": self.used, "limit": self.limit}
        if self.predicted is not None:  # optional in format 1: records without it read as None
            out["predicted"] = self.predicted
        return out


BUDGET_KINDS = ("tokens", "toolCalls", "seconds", "usd")


def _num(x: float, which: str = "") -> str:
    if which == "usd":
        return f"{x:.6g}"
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"
