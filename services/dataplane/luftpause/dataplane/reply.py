"""What the dataplane learns from an engine's reply: finish reason, usage, tool call ids.

Pure module: no I/O. `summarize_completion` reads a non-stream reply body once; the stream
counterpart is `sse.SseObserver`, which builds the same `ReplySummary` incrementally.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token counts of one reply as the engine reported them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplySummary:
    """The facts of a finished reply the scheduler needs."""

    finish_reason: str = ""
    usage: Usage | None = None
    tool_call_ids: tuple[str, ...] = ()
    tool_calls: bool = False

    def __post_init__(self) -> None:
        if self.tool_call_ids and not self.tool_calls:
            raise ValueError("a reply with tool call ids has tool calls")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage_of(raw: Any) -> Usage | None:
    """Read an OpenAI `usage` object; cached tokens from `prompt_tokens_details` or top level."""
    if not isinstance(raw, Mapping):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if cached is None:
        cached = raw.get("cached_tokens")
    return Usage(
        prompt_tokens=_int(raw.get("prompt_tokens")),
        completion_tokens=_int(raw.get("completion_tokens")),
        cached_tokens=_int(cached),
    )


def tool_call_ids_of(calls: Any, into: list[str]) -> bool:
    """Append the ids of a `tool_calls` list to `into`; True if the list holds any call."""
    if not isinstance(calls, list) or not calls:
        return False
    for call in calls:
        if isinstance(call, Mapping):
            call_id = call.get("id")
            if isinstance(call_id, str) and call_id and call_id not in into:
                into.append(call_id)
    return True


def summarize(
    finish_reason: str, usage: Usage | None, ids: list[str], any_calls: bool
) -> ReplySummary:
    """Build the summary; a reply pauses on a tool if it says so or carries any tool call."""
    return ReplySummary(
        finish_reason=finish_reason,
        usage=usage,
        tool_call_ids=tuple(ids),
        tool_calls=any_calls or finish_reason == "tool_calls",
    )


def json_object(body: bytes) -> Mapping[str, Any] | None:
    """A reply body as a JSON object; None if it is not one."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, Mapping) else None


def summarize_completion(body: bytes) -> ReplySummary:
    """Summarise a non-stream chat completion body; an unreadable body gives an empty summary."""
    doc = json_object(body)
    if doc is None:
        return ReplySummary()
    finish_reason = ""
    ids: list[str] = []
    any_calls = False
    choices = doc.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, Mapping):
            continue
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            finish_reason = reason
        message = choice.get("message")
        if isinstance(message, Mapping):
            any_calls = tool_call_ids_of(message.get("tool_calls"), ids) or any_calls
    return summarize(finish_reason, usage_of(doc.get("usage")), ids, any_calls)
