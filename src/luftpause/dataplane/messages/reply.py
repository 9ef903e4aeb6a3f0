"""A chat completion's events written as a Messages API reply: a stream, or one message.

Pure module: no I/O. `MessagesWriter` takes the events `chatstream` reads from an engine's Chat
Completions reply and writes the Messages API's server-sent events as they come (`write`), then
closes the message (`finish`); it also builds the whole message, which is the non-stream reply
(`document`). The stream it writes, for text then a tool call:

    message_start                        at the engine's first chunk (usage follows at the end)
    content_block_start  text            at the first text (`thinking` for reasoning text)
    content_block_delta  text_delta ...
    content_block_stop
    content_block_start  tool_use        id and name as the engine gave them
    content_block_delta  input_json_delta ...
    content_block_stop
    message_delta        stop_reason, usage
    message_stop

Stop reasons: stop -> end_turn, length -> max_tokens, tool_calls -> tool_use (also when a reply
with calls says stop), content_filter -> refusal. Usage: input_tokens are the prompt tokens not
read from the engine's cache, cache_read_input_tokens the cached ones (Anthropic counts them
apart), output_tokens the completion tokens. An error chunk from the engine becomes an `error`
event, after which the message is not closed. Tool calls are written in the order they start;
an engine that interleaves their argument deltas gets each call's later deltas in the whole
message only.
"""

from __future__ import annotations

import json
from typing import Any

from luftpause.dataplane.chatstream import (
    Begin,
    CallArgs,
    CallStart,
    Done,
    Event,
    Failed,
    Finish,
    Reasoning,
    Text,
    Used,
)
from luftpause.dataplane.reply import Usage

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def frame(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event with its name, as the Messages API writes them."""
    return b"event: %s\ndata: %s\n\n" % (
        event.encode(),
        json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode(),
    )


def usage_document(usage: Usage | None) -> dict[str, int]:
    """Anthropic's usage of a reply whose chat usage is `usage`."""
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    return {
        "input_tokens": max(usage.prompt_tokens - usage.cached_tokens, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def _input(arguments: str) -> Any:
    """A tool call's arguments as its `input` object ({} when the engine wrote none or no
    JSON object)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessagesWriter:
    """Write chat events as a Messages API reply; see the module docstring."""

    __slots__ = (
        "_blocks",
        "_calls",
        "_ended",
        "_id",
        "_model",
        "_open",
        "_reason",
        "_started",
        "_stream",
        "_usage",
    )

    def __init__(self, model: str, *, stream: bool = True) -> None:
        self._model = model
        self._stream = stream
        self._id = ""
        self._started = False
        self._ended = False
        # The content blocks so far; a tool_use block keeps its arguments as text until the end.
        self._blocks: list[dict[str, Any]] = []
        # The open block: its index, and ("text" | "thinking" | call index).
        self._open: tuple[int, str | int] | None = None
        # Chat tool call index -> its block's index.
        self._calls: dict[int, int] = {}
        self._reason = ""
        self._usage: Usage | None = None

    def write(self, events: list[Event]) -> bytes:
        """The frames these events make (b"" when not streaming)."""
        out: list[bytes] = []
        for event in events:
            self._event(event, out)
        return b"".join(out) if self._stream else b""

    def finish(self) -> bytes:
        """Close the message (message_delta, message_stop) unless it was closed or failed."""
        if self._ended:
            return b""
        out: list[bytes] = []
        self._start(out)
        self._close(out)
        self._ended = True
        delta = {"stop_reason": self._stop_reason(), "stop_sequence": None}
        usage = usage_document(self._usage)
        self._emit(out, "message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        self._emit(out, "message_stop", {"type": "message_stop"})
        return b"".join(out) if self._stream else b""

    def document(self) -> dict[str, Any]:
        """The whole message as the events so far made it."""
        content = []
        for block in self._blocks:
            if block["type"] == "tool_use":
                block = {**block, "input": _input(block["input"])}
            content.append(block)
        return {
            "id": self._message_id(),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": content,
            "stop_reason": self._stop_reason(),
            "stop_sequence": None,
            "usage": usage_document(self._usage),
        }

    def _message_id(self) -> str:
        return "msg_" + (self._id.removeprefix("chatcmpl-") or "luftpause")

    def _stop_reason(self) -> str:
        if self._calls and self._reason in ("", "stop"):
            return "tool_use"
        return STOP_REASONS.get(self._reason, "end_turn")

    def _emit(self, out: list[bytes], name: str, data: dict[str, Any]) -> None:
        if self._stream:
            out.append(frame(name, data))

    def _event(self, event: Event, out: list[bytes]) -> None:
        if self._ended:
            return
        if isinstance(event, Begin):
            self._id = self._id or event.id
            self._start(out)
        elif isinstance(event, Text):
            self._text("text", event.text, out)
        elif isinstance(event, Reasoning):
            self._text("thinking", event.text, out)
        elif isinstance(event, CallStart):
            self._call_start(event, out)
        elif isinstance(event, CallArgs):
            self._call_args(event, out)
        elif isinstance(event, Finish):
            self._reason = event.reason
            self._close(out)
        elif isinstance(event, Used):
            self._usage = event.usage
        elif isinstance(event, Failed):
            self._ended = True
            error = {"type": "api_error", "message": event.message}
            self._emit(out, "error", {"type": "error", "error": error})
        elif isinstance(event, Done):
            out.append(self.finish())

    def _start(self, out: list[bytes]) -> None:
        if self._started:
            return
        self._started = True
        message = {**self.document(), "stop_reason": None, "usage": usage_document(None)}
        self._emit(out, "message_start", {"type": "message_start", "message": message})

    def _open_block(self, block: dict[str, Any], key: str | int, out: list[bytes]) -> int:
        self._start(out)
        self._close(out)
        index = len(self._blocks)
        self._blocks.append(block)
        self._open = (index, key)
        start = {"type": "content_block_start", "index": index, "content_block": block}
        self._emit(out, "content_block_start", start)
        return index

    def _close(self, out: list[bytes]) -> None:
        if self._open is not None:
            index = self._open[0]
            self._open = None
            self._emit(out, "content_block_stop", {"type": "content_block_stop", "index": index})

    def _text(self, kind: str, text: str, out: list[bytes]) -> None:
        if self._open is not None and self._open[1] == kind:
            index = self._open[0]
        elif kind == "text":
            index = self._open_block({"type": "text", "text": ""}, kind, out)
        else:
            index = self._open_block(
                {"type": "thinking", "thinking": "", "signature": ""}, kind, out
            )
        self._blocks[index][kind] += text
        delta = {"type": f"{kind}_delta", kind: text}
        data = {"type": "content_block_delta", "index": index, "delta": delta}
        self._emit(out, "content_block_delta", data)

    def _call_start(self, event: CallStart, out: list[bytes]) -> None:
        call_id = event.id or f"toolu_{self._message_id()[4:]}_{event.index}"
        block = {"type": "tool_use", "id": call_id, "name": event.name, "input": {}}
        self._calls[event.index] = index = self._open_block(block, event.index, out)
        self._blocks[index] = {**block, "input": ""}  # the arguments' text, until the end

    def _call_args(self, event: CallArgs, out: list[bytes]) -> None:
        index = self._calls.get(event.index)
        if index is None:
            return
        self._blocks[index]["input"] += event.text
        if self._open is not None and self._open == (index, event.index):
            delta = {"type": "input_json_delta", "partial_json": event.text}
            data = {"type": "content_block_delta", "index": index, "delta": delta}
            self._emit(out, "content_block_delta", data)
