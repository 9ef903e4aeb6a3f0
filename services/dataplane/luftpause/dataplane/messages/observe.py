"""A Messages API reply relayed unchanged, read for the turn's facts.

Pure module: no I/O. When the engine serves the Messages API itself its bytes go to the client
as they are; `MessagesObserver` reads the stream on the way (`feed()`/`flush()`) for what the
scheduler is told, as `sse.SseObserver` does for Chat Completions, and `summarize_message` reads
a whole (non-stream) message. Facts, in Chat Completions terms so the scheduler, metrics and
traces see one vocabulary:

    first token      the first text, thinking or tool input delta, or a tool_use block's start
    finish reason    stop_reason end_turn | stop_sequence -> stop, max_tokens -> length,
                     tool_use -> tool_calls, refusal -> content_filter
    usage            prompt = input + cache_read + cache_creation tokens, cached = cache_read
                     (none when every count is 0: a translated reply whose engine said none)
    tool call ids    the tool_use blocks' ids (the run is recognised by them when they come back)

Cost: the payloads of `message_start`, `content_block_start` and `message_delta` are decoded (a
handful per reply); `content_block_delta` payloads only until the first token, and `ping` never.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from luftpause.dataplane.reply import ReplySummary, Usage, json_object, summarize
from luftpause.dataplane.sse import EventObserver

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_ALWAYS = frozenset({b"message_start", b"content_block_start", b"message_delta"})


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class _Facts:
    __slots__ = ("finish_reason", "ids", "input", "output")

    def __init__(self) -> None:
        self.finish_reason = ""
        self.ids: list[str] = []
        # Anthropic's usage fields as last reported: message_start, then message_delta.
        self.input: dict[str, int] = {}
        self.output: int | None = None

    def usage(self, raw: Any) -> None:
        if not isinstance(raw, Mapping):
            return
        for name in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            if raw.get(name) is not None:
                self.input[name] = _int(raw.get(name))
        if raw.get("output_tokens") is not None:
            self.output = _int(raw.get("output_tokens"))

    def block(self, block: Any) -> bool:
        """Note a content block; True if it is a tool call."""
        if not isinstance(block, Mapping) or block.get("type") != "tool_use":
            return False
        call_id = block.get("id")
        if isinstance(call_id, str) and call_id and call_id not in self.ids:
            self.ids.append(call_id)
        return True

    def summary(self) -> ReplySummary:
        usage = None
        # No prompt is 0 tokens long: all zeros is a usage the engine did not know.
        if sum(self.input.values()) or self.output:
            cached = self.input.get("cache_read_input_tokens", 0)
            usage = Usage(
                prompt_tokens=sum(self.input.values()),
                completion_tokens=self.output or 0,
                cached_tokens=cached,
            )
        return summarize(self.finish_reason, usage, self.ids, bool(self.ids))

    def stop(self, reason: Any) -> None:
        if isinstance(reason, str) and reason:
            self.finish_reason = FINISH_REASONS.get(reason, reason)


class MessagesObserver(EventObserver):
    """Watch a Messages API stream; `feed` says when the first token has just arrived."""

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
        return name != b"ping" and not (self.first_token and name and name not in _ALWAYS)

    def _event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            if isinstance(message, Mapping):
                self._facts.usage(message.get("usage"))
        elif kind == "content_block_start":
            if self._facts.block(event.get("content_block")):
                self.first_token = True
        elif kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, Mapping) and any(
                delta.get(key) for key in ("text", "thinking", "partial_json")
            ):
                self.first_token = True
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, Mapping):
                self._facts.stop(delta.get("stop_reason"))
            self._facts.usage(event.get("usage"))


def summarize_message(body: bytes) -> ReplySummary:
    """Summarise a whole message body; an unreadable body gives an empty summary."""
    doc = json_object(body)
    if doc is None:
        return ReplySummary()
    facts = _Facts()
    content = doc.get("content")
    for block in content if isinstance(content, list) else ():
        facts.block(block)
    facts.stop(doc.get("stop_reason"))
    facts.usage(doc.get("usage"))
    return facts.summary()
