"""A Responses API reply relayed unchanged, read for the turn's facts.

Pure module: no I/O. When the engine serves the Responses API itself its bytes go to the client
as they are; `ResponsesObserver` reads the stream on the way (`feed()`/`flush()`) and
`summarize_response` a whole (non-stream) response. Facts, in Chat Completions terms:

    first token      the first delta event (output text, reasoning, arguments), or a call item
    finish reason    completed -> stop (tool_calls when the output has calls), incomplete for
                     max_output_tokens -> length (content_filter as it says), failed -> ""
    usage            input_tokens (cached tokens among them), output_tokens
    tool call ids    the call items' `call_id`s (the run is recognised by them when they come
                     back as tool outputs)

Cost: by the event's name: `response.output_item.added` and the final `response.completed` /
`.incomplete` / `.failed` payloads are decoded; deltas never (their name says a token came).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from luftpause.dataplane.reply import ReplySummary, json_object, summarize, usage_of
from luftpause.dataplane.sse import EventObserver

CALLS = frozenset({"function_call", "custom_tool_call"})
_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_DECODED = frozenset({b"response.output_item.added", *(e.encode() for e in _ENDS)})


def _usage(raw: Any) -> Any:
    """The Responses usage in Chat Completions' names, for `reply.usage_of`."""
    if not isinstance(raw, Mapping):
        return None
    details = raw.get("input_tokens_details")
    return {
        "prompt_tokens": raw.get("input_tokens"),
        "completion_tokens": raw.get("output_tokens"),
        "prompt_tokens_details": details if isinstance(details, Mapping) else None,
    }


def _finish_reason(response: Mapping[str, Any], calls: bool) -> str:
    status = response.get("status")
    if status == "completed":
        return "tool_calls" if calls else "stop"
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        return "length" if reason == "max_output_tokens" else str(reason or "length")
    return ""


class _Facts:
    __slots__ = ("finish_reason", "ids", "usage")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.finish_reason = ""
        self.usage: Any = None

    def item(self, item: Any) -> bool:
        """Note an output item; True if it is a tool call."""
        if not isinstance(item, Mapping) or item.get("type") not in CALLS:
            return False
        call_id = item.get("call_id")
        if isinstance(call_id, str) and call_id and call_id not in self.ids:
            self.ids.append(call_id)
        return True

    def response(self, response: Mapping[str, Any]) -> None:
        output = response.get("output")
        for item in output if isinstance(output, list) else ():
            self.item(item)
        self.finish_reason = _finish_reason(response, bool(self.ids))
        self.usage = usage_of(_usage(response.get("usage")))

    def summary(self) -> ReplySummary:
        return summarize(self.finish_reason, self.usage, self.ids, bool(self.ids))


class ResponsesObserver(EventObserver):
    """Watch a Responses API stream; `feed` says when the first token has just arrived."""

    __slots__ = ("_facts",)

    def __init__(self) -> None:
        super().__init__()
        self._facts = _Facts()

    def summary(self) -> ReplySummary:
        return self._facts.summary()

    @property
    def call_ids(self) -> Sequence[str]:
        return self._facts.ids

    def _decodes(self, name: bytes) -> bool:
        if name.endswith(b".delta"):
            self.first_token = True  # its name says a token came: nothing to decode
            return False
        return not name or name in _DECODED

    def _event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if isinstance(kind, str) and kind.endswith(".delta"):
            self.first_token = True  # an event without a name line
        elif kind == "response.output_item.added":
            if self._facts.item(event.get("item")):
                self.first_token = True
        elif kind in _ENDS:
            response = event.get("response")
            if isinstance(response, Mapping):
                self._facts.response(response)


def summarize_response(body: bytes) -> ReplySummary:
    """Summarise a whole response body; an unreadable body gives an empty summary."""
    doc = json_object(body)
    if doc is None:
        return ReplySummary()
    facts = _Facts()
    facts.response(doc)
    return facts.summary()
