"""A chat completion's events written as a Responses API reply: a stream, or one response.

Pure module: no I/O. `ResponsesWriter` takes the events `chatstream` reads from an engine's Chat
Completions reply and writes the Responses API's server-sent events as they come (`write`), then
the closing `response.completed` (`finish`); it also builds the whole response object, which is
the non-stream reply (`document`). Every event carries its `sequence_number`. The stream, for
text then a tool call:

    response.created, response.in_progress             at the engine's first chunk
    response.output_item.added        message
    response.content_part.added       output_text
    response.output_text.delta ...
    response.output_text.done, response.content_part.done, response.output_item.done
    response.output_item.added        function_call (call_id, name, namespace)
    response.function_call_arguments.delta ...
    response.function_call_arguments.done, response.output_item.done
    response.completed                the whole response, with usage

Reasoning text becomes a `reasoning` item (`response.reasoning_text.delta`). A call to a tool
that was a namespace's (Codex's MCP servers) names its namespace and tool apart again; a call to
a custom tool becomes a `custom_tool_call` whose `input` is the chat call's `input` argument. A
reply cut by max_tokens ends `response.incomplete` (reason max_output_tokens), one stopped by a
content filter likewise (reason content_filter); an error chunk from the engine ends
`response.failed`. Usage: input_tokens with cached_tokens among them, output_tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
from luftpause.dataplane.responses.request import ToolNames

INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def usage_document(usage: Usage | None) -> dict[str, Any] | None:
    """The Responses API's usage of a reply whose chat usage is `usage`."""
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _custom_input(arguments: str) -> str:
    """A custom tool's input from the chat call's arguments (`{"input": ...}`), else as is."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, Mapping) and isinstance(value.get("input"), str):
        return str(value["input"])
    return arguments


class ResponsesWriter:
    """Write chat events as a Responses API reply; see the module docstring."""

    __slots__ = (
        "_calls",
        "_created",
        "_ended",
        "_error",
        "_id",
        "_items",
        "_names",
        "_open",
        "_reason",
        "_request",
        "_sequence",
        "_started",
        "_stream",
        "_usage",
    )

    def __init__(
        self, request: Mapping[str, Any], names: ToolNames, *, stream: bool = True
    ) -> None:
        # The request's fields a response echoes (model, tools, instructions, ...).
        self._request = request
        self._names = names
        self._stream = stream
        self._id = ""
        self._created = 0
        self._sequence = 0
        self._started = False
        self._ended = False
        self._items: list[dict[str, Any]] = []
        # The open item: its output index and ("message" | "reasoning" | chat call index).
        self._open: tuple[int, str | int] | None = None
        self._calls: dict[int, int] = {}
        self._reason = ""
        self._usage: Usage | None = None
        self._error: str | None = None

    def write(self, events: list[Event]) -> bytes:
        """The events' frames (b"" when not streaming)."""
        out: list[bytes] = []
        for event in events:
            self._event(event, out)
        return b"".join(out) if self._stream else b""

    def finish(self) -> bytes:
        """`response.completed` (or `.incomplete`) unless the response ended already."""
        if self._ended:
            return b""
        out: list[bytes] = []
        self._start(out)
        self._close(out)
        self._ended = True
        status = self._status()
        self._emit(out, f"response.{status}", {"response": self.document()})
        return b"".join(out) if self._stream else b""

    def document(self) -> dict[str, Any]:
        """The response object as the events so far made it."""
        doc = self._request
        status = self._status() if self._ended else "in_progress"
        reason = INCOMPLETE.get(self._reason)
        return {
            "id": self._response_id(),
            "object": "response",
            "created_at": self._created,
            "status": status,
            "error": None
            if self._error is None
            else {"code": "server_error", "message": self._error},
            "incomplete_details": {"reason": reason} if status == "incomplete" else None,
            "instructions": doc.get("instructions"),
            "max_output_tokens": doc.get("max_output_tokens"),
            "metadata": doc.get("metadata") or {},
            "model": doc.get("model"),
            "output": [dict(item) for item in self._items],
            "parallel_tool_calls": doc.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": doc.get("reasoning") or {"effort": None, "summary": None},
            "store": False,
            "temperature": doc.get("temperature", 1.0),
            "text": doc.get("text") or {"format": {"type": "text"}},
            "tool_choice": doc.get("tool_choice", "auto"),
            "tools": doc.get("tools") or [],
            "top_p": doc.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": usage_document(self._usage) if self._ended else None,
            "user": None,
        }

    def _status(self) -> str:
        if self._error is not None:
            return "failed"
        return "incomplete" if self._reason in INCOMPLETE else "completed"

    def _response_id(self) -> str:
        return "resp_" + (self._id.removeprefix("chatcmpl-") or "luftpause")

    def _item_id(self, prefix: str, index: int) -> str:
        return f"{prefix}_{self._response_id()[5:]}_{index}"

    def _emit(self, out: list[bytes], kind: str, data: dict[str, Any]) -> None:
        if not self._stream:
            return
        data = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        body = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        out.append(b"event: %s\ndata: %s\n\n" % (kind.encode(), body))

    def _event(self, event: Event, out: list[bytes]) -> None:
        if self._ended:
            return
        if isinstance(event, Begin):
            self._id = self._id or event.id
            self._created = self._created or event.created
            self._start(out)
        elif isinstance(event, Text):
            self._text("message", event.text, out)
        elif isinstance(event, Reasoning):
            self._text("reasoning", event.text, out)
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
            self._start(out)
            self._close(out)
            self._error = event.message
            self._ended = True
            self._emit(out, "response.failed", {"response": self.document()})
        elif isinstance(event, Done):
            out.append(self.finish())

    def _start(self, out: list[bytes]) -> None:
        if self._started:
            return
        self._started = True
        created = self.document()
        self._emit(out, "response.created", {"response": created})
        self._emit(out, "response.in_progress", {"response": created})

    def _add(self, item: dict[str, Any], key: str | int, out: list[bytes]) -> int:
        self._start(out)
        self._close(out)
        index = len(self._items)
        self._items.append(item)
        self._open = (index, key)
        self._emit(out, "response.output_item.added", {"output_index": index, "item": dict(item)})
        return index

    def _text(self, kind: str, text: str, out: list[bytes]) -> None:
        if self._open is not None and self._open[1] == kind:
            index = self._open[0]
        elif kind == "message":
            item: dict[str, Any] = {
                "id": self._item_id("msg", len(self._items)),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            index = self._add(item, kind, out)
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
            part["logprobs"] = []
            item["content"] = [part]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            self._emit(out, "response.content_part.added", {**where, "part": dict(part)})
        else:
            item = {
                "id": self._item_id("rs", len(self._items)),
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": ""}],
            }
            index = self._add(item, kind, out)
        content = self._items[index]["content"][0]
        content["text"] += text
        where = {"item_id": self._items[index]["id"], "output_index": index, "content_index": 0}
        if kind == "message":
            self._emit(out, "response.output_text.delta", {**where, "delta": text, "logprobs": []})
        else:
            self._emit(out, "response.reasoning_text.delta", {**where, "delta": text})

    def _call_start(self, event: CallStart, out: list[bytes]) -> None:
        tool = self._names.of(event.name)
        index = len(self._items)
        item: dict[str, Any] = {"id": self._item_id("fc", index), "type": "function_call"}
        item.update(status="in_progress", call_id=event.id or item["id"], name=tool.name)
        if tool.custom:
            item.update(id=self._item_id("ctc", index), type="custom_tool_call", input="")
        else:
            item["arguments"] = ""
        if tool.namespace:
            item["namespace"] = tool.namespace
        self._calls[event.index] = self._add(item, event.index, out)

    def _call_args(self, event: CallArgs, out: list[bytes]) -> None:
        index = self._calls.get(event.index)
        if index is None:
            return
        item = self._items[index]
        field = "input" if item["type"] == "custom_tool_call" else "arguments"
        item[field] += event.text
        if field == "arguments" and self._open == (index, event.index):
            where = {"item_id": item["id"], "output_index": index}
            self._emit(
                out, "response.function_call_arguments.delta", {**where, "delta": event.text}
            )

    def _close(self, out: list[bytes]) -> None:
        if self._open is None:
            return
        index, _ = self._open
        self._open = None
        item = self._items[index]
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            text = {**where, "content_index": 0, "text": part["text"], "logprobs": []}
            self._emit(out, "response.output_text.done", text)
            self._emit(
                out, "response.content_part.done", {**where, "content_index": 0, "part": part}
            )
        elif item["type"] == "reasoning":
            text = {**where, "content_index": 0, "text": item["content"][0]["text"]}
            self._emit(out, "response.reasoning_text.done", text)
        elif item["type"] == "function_call":
            done = {**where, "name": item["name"], "arguments": item["arguments"]}
            self._emit(out, "response.function_call_arguments.done", done)
        else:
            item["input"] = _custom_input(item["input"])
            self._emit(
                out, "response.custom_tool_call_input.done", {**where, "input": item["input"]}
            )
        if item["type"] != "reasoning":
            item["status"] = "completed"
        self._emit(out, "response.output_item.done", {"output_index": index, "item": dict(item)})
