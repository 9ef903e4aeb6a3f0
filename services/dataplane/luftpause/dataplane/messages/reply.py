"""A chat completion's events written as a Messages API reply: a stream, or one message.

Pure module: no I/O. `MessagesWriter` (a `writer.PartWriter`, its parts content blocks) takes the
events `chatstream` reads from an engine's Chat Completions reply and writes the Messages API's
server-sent events as they come (`write`), then closes the message (`finish`); it also builds the
whole message, which is the non-stream reply (`document`). The stream it writes, for text then a
tool call:

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

from luftpause.dataplane.chatstream import CallStart
from luftpause.dataplane.reply import Usage
from luftpause.dataplane.writer import PartWriter, frame

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


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


class MessagesWriter(PartWriter):
    """Write chat events as a Messages API reply; see the module docstring."""

    __slots__ = ("_blocks", "_model")

    def __init__(self, model: str, *, stream: bool = True) -> None:
        super().__init__(stream=stream)
        self._model = model
        # The content blocks so far; a tool_use block keeps its arguments as text until the end.
        self._blocks: list[dict[str, Any]] = []

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
            out.append(frame(name, {"type": name, **data}))

    def _begin(self, out: list[bytes]) -> None:
        message = {**self.document(), "stop_reason": None, "usage": usage_document(None)}
        self._emit(out, "message_start", {"message": message})

    def _open_block(self, block: dict[str, Any], out: list[bytes]) -> int:
        index = len(self._blocks)
        self._blocks.append(block)
        self._emit(out, "content_block_start", {"index": index, "content_block": block})
        return index

    def _open_text(self, kind: str, out: list[bytes]) -> int:
        if kind == "text":
            return self._open_block({"type": "text", "text": ""}, out)
        return self._open_block({"type": "thinking", "thinking": "", "signature": ""}, out)

    def _add_text(self, index: int, kind: str, text: str, out: list[bytes]) -> None:
        field = "text" if kind == "text" else "thinking"
        self._blocks[index][field] += text
        delta = {"type": f"{field}_delta", field: text}
        self._emit(out, "content_block_delta", {"index": index, "delta": delta})

    def _open_call(self, call: CallStart, out: list[bytes]) -> int:
        call_id = call.id or f"toolu_{self._message_id()[4:]}_{call.index}"
        block = {"type": "tool_use", "id": call_id, "name": call.name, "input": {}}
        index = self._open_block(block, out)
        self._blocks[index] = {**block, "input": ""}  # the arguments' text, until the end
        return index

    def _add_args(self, index: int, text: str, live: bool, out: list[bytes]) -> None:
        self._blocks[index]["input"] += text
        if live:
            delta = {"type": "input_json_delta", "partial_json": text}
            self._emit(out, "content_block_delta", {"index": index, "delta": delta})

    def _close_part(self, index: int, out: list[bytes]) -> None:
        self._emit(out, "content_block_stop", {"index": index})

    def _end(self, out: list[bytes]) -> None:
        delta = {"stop_reason": self._stop_reason(), "stop_sequence": None}
        self._emit(out, "message_delta", {"delta": delta, "usage": usage_document(self._usage)})
        self._emit(out, "message_stop", {})

    def _fail(self, message: str, out: list[bytes]) -> None:
        self._emit(out, "error", {"error": {"type": "api_error", "message": message}})
