"""A chat completion's events written as a Responses API reply: a stream, or one response.

Pure module: no I/O. `ResponsesWriter` (a `writer.PartWriter`, its parts output items) takes the
events `chatstream` reads from an engine's Chat Completions reply and writes the Responses API's
server-sent events as they come (`write`), then the closing `response.completed` (`finish`); it
also builds the whole response object, which is the non-stream reply (`document`). Every event
carries its `sequence_number`. The stream, for text then a tool call:

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

from luftpause.dataplane.chatstream import CallStart
from luftpause.dataplane.reply import Usage
from luftpause.dataplane.responses.request import ToolNames
from luftpause.dataplane.writer import PartWriter, frame

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


class ResponsesWriter(PartWriter):
    """Write chat events as a Responses API reply; see the module docstring."""

    __slots__ = ("_error", "_items", "_names", "_request", "_sequence")

    def __init__(
        self, request: Mapping[str, Any], names: ToolNames, *, stream: bool = True
    ) -> None:
        super().__init__(stream=stream)
        # The request's fields a response echoes (model, tools, instructions, ...).
        self._request = request
        self._names = names
        self._sequence = 0
        self._items: list[dict[str, Any]] = []
        self._error: str | None = None

    def document(self) -> dict[str, Any]:
        """The response object as the events so far made it."""
        doc = self._request
        status = self._status() if self._ended else "in_progress"
        reason = INCOMPLETE.get(self._reason)
        error = None if self._error is None else {"code": "server_error", "message": self._error}
        return {
            "id": self._response_id(),
            "object": "response",
            "created_at": self._created,
            "status": status,
            "error": error,
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
        out.append(frame(kind, {"type": kind, "sequence_number": self._sequence, **data}))
        self._sequence += 1

    def _where(self, index: int) -> dict[str, Any]:
        return {"item_id": self._items[index]["id"], "output_index": index}

    def _begin(self, out: list[bytes]) -> None:
        created = self.document()
        self._emit(out, "response.created", {"response": created})
        self._emit(out, "response.in_progress", {"response": created})

    def _add(self, item: dict[str, Any], out: list[bytes]) -> int:
        index = len(self._items)
        self._items.append(item)
        self._emit(out, "response.output_item.added", {"output_index": index, "item": dict(item)})
        return index

    def _open_text(self, kind: str, out: list[bytes]) -> int:
        if kind == "reasoning":
            item: dict[str, Any] = {"id": self._item_id("rs", len(self._items))}
            item.update(type="reasoning", summary=[])
            index = self._add(item, out)
            item["content"] = [{"type": "reasoning_text", "text": ""}]
            return index
        item = {"id": self._item_id("msg", len(self._items)), "type": "message"}
        item.update(status="in_progress", role="assistant", content=[])
        index = self._add(item, out)
        part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
        part["logprobs"] = []
        item["content"] = [part]
        self._emit(
            out,
            "response.content_part.added",
            {**self._where(index), "content_index": 0, "part": dict(part)},
        )
        return index

    def _add_text(self, index: int, kind: str, text: str, out: list[bytes]) -> None:
        self._items[index]["content"][0]["text"] += text
        where = {**self._where(index), "content_index": 0, "delta": text}
        if kind == "text":
            self._emit(out, "response.output_text.delta", {**where, "logprobs": []})
        else:
            self._emit(out, "response.reasoning_text.delta", where)

    def _open_call(self, call: CallStart, out: list[bytes]) -> int:
        tool = self._names.of(call.name)
        index = len(self._items)
        item: dict[str, Any] = {"id": self._item_id("fc", index), "type": "function_call"}
        item.update(status="in_progress", call_id=call.id or item["id"], name=tool.name)
        if tool.custom:
            item.update(id=self._item_id("ctc", index), type="custom_tool_call", input="")
        else:
            item["arguments"] = ""
        if tool.namespace:
            item["namespace"] = tool.namespace
        return self._add(item, out)

    def _add_args(self, index: int, text: str, live: bool, out: list[bytes]) -> None:
        item = self._items[index]
        field = "input" if item["type"] == "custom_tool_call" else "arguments"
        item[field] += text
        if field == "arguments" and live:
            self._emit(
                out, "response.function_call_arguments.delta", {**self._where(index), "delta": text}
            )

    def _close_part(self, index: int, out: list[bytes]) -> None:
        item = self._items[index]
        where = self._where(index)
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

    def _end(self, out: list[bytes]) -> None:
        self._emit(out, f"response.{self._status()}", {"response": self.document()})

    def _fail(self, message: str, out: list[bytes]) -> None:
        self._start(out)
        self._close(out)
        self._error = message
        self._emit(out, "response.failed", {"response": self.document()})
