"""A Responses API request: its checks, what the turn path reads of it, and Chat Completions.

Pure module: no I/O. `read_request` checks what the dataplane relies on (`model`, an `input`,
`max_output_tokens`, `stream`) and keeps the parsed document. A turn is one whole conversation
(`store: false`, as Codex sends it): luftpause keeps no responses, so `previous_response_id`
and `item_reference` are refused. `echoed_ids` are the `call_id`s of its tool outputs, by which a
run without a run header is recognised; `to_chat` is the request in Chat Completions terms, for an
engine that does not serve the Responses API itself:

    instructions                         -> a first `system` message
    input (a string)                     -> one `user` message
    message items (user, system, developer, assistant) -> messages of that role (developer as
                                            system); input_text, output_text -> text,
                                            input_image -> an `image_url` part
    function_call, custom_tool_call      -> `tool_calls` of one assistant message (with the
                                            assistant text before them)
    function_call_output, custom_tool_call_output -> `tool` messages
    reasoning items                      -> dropped (an engine's chat template cannot take them)
    function tools                       -> `function` tools
    namespace tools (Codex's MCP servers) -> one function per tool inside, named
                                            `<namespace>__<name>` (`ToolNames` maps it back)
    custom tools (free-form input)       -> a function with one string parameter, `input`
    web_search and other hosted tools    -> left out: no engine runs them
    tool_choice, parallel_tool_calls     -> the same (a named tool as a named function)
    text.format json_schema | json_object -> response_format
    max_output_tokens                    -> max_tokens
    stream                               -> stream, with stream_options.include_usage

`reasoning`, `include`, `store`, `prompt_cache_key`, `metadata` and `client_metadata` are not
sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.forwarding import (
    count_field,
    parse_json_object,
    require_model,
    stream_flag,
)

OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's whole input."}},
    "required": ["input"],
}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponsesRequest:
    """A checked Responses API request."""

    doc: Mapping[str, Any]
    model: str
    max_tokens: int
    stream: bool


@dataclass(frozen=True, slots=True)
class ToolName:
    """A Responses tool behind a chat function's name."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass(frozen=True, slots=True)
class ToolNames:
    """Chat function name -> the Responses tool it stands for (plain functions are absent)."""

    names: Mapping[str, ToolName] = field(default_factory=dict)

    def of(self, chat_name: str) -> ToolName:
        return self.names.get(chat_name) or ToolName(chat_name)


def joined(namespace: str | None, name: str) -> str:
    """The chat function name of tool `name` in `namespace`."""
    if not namespace:
        return name
    return f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"


def read_request(body: bytes) -> ResponsesRequest:
    """The request in `body`; `BadRequest` if it breaks the rules for the fields read here."""
    doc = parse_json_object(body)
    model = require_model(doc)
    items = doc.get("input")
    if not (isinstance(items, str) and items) and not (isinstance(items, list) and items):
        raise BadRequest("'input' must be a non-empty string or list of items")
    if isinstance(items, list) and not all(isinstance(i, Mapping) for i in items):
        raise BadRequest("every entry of 'input' must be an object")
    if doc.get("previous_response_id") is not None:
        raise BadRequest(
            "'previous_response_id' is not supported: luftpause keeps no responses; send the "
            "whole conversation in 'input' with 'store': false"
        )
    if isinstance(items, list) and any(i.get("type") == "item_reference" for i in items):
        raise BadRequest("'item_reference' items are not supported: luftpause keeps no items")
    if doc.get("tools") is not None and not isinstance(doc["tools"], list):
        raise BadRequest("'tools' must be a list")
    return ResponsesRequest(
        doc=doc,
        model=model,
        max_tokens=count_field(doc, "max_output_tokens"),
        stream=stream_flag(doc),
    )


def _items(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = doc["input"]
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": items}]
    return list(items)


def echoed_ids(doc: Mapping[str, Any]) -> Iterator[str]:
    """The `call_id`s of the request's tool outputs, latest first."""
    for item in reversed(_items(doc)):
        if item.get("type") in OUTPUTS:
            call_id = item.get("call_id")
            if isinstance(call_id, str) and call_id:
                yield call_id


def opening(doc: Mapping[str, Any]) -> tuple[list[Any], Any]:
    """The parts of the request's opening (its instructions, then items) and its tools."""
    instructions = doc.get("instructions")
    return ([instructions] if instructions else []) + _items(doc), doc.get("tools")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, Mapping) and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
    return "\n\n".join(texts)


def _user_content(content: Any, where: str) -> Any:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content if isinstance(content, list) else ()):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise BadRequest(f"{where}.content.{j}: only images given by image_url translate")
            image: dict[str, Any] = {"url": url}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            raise BadRequest(
                f"{where}.content.{j}: files cannot be translated to Chat Completions "
                "(this engine does not serve the Responses API)"
            )
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts


class _Conversation:
    """Chat messages built item by item; an assistant turn gathers its text and calls."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._assistant: dict[str, Any] | None = None

    def close_assistant(self) -> None:
        if self._assistant is not None:
            if not self._assistant.get("tool_calls"):
                self._assistant["content"] = self._assistant["content"] or ""
            self.messages.append(self._assistant)
            self._assistant = None

    def assistant(self) -> dict[str, Any]:
        if self._assistant is None:
            self._assistant = {"role": "assistant", "content": None}
        return self._assistant

    def add(self, message: dict[str, Any]) -> None:
        self.close_assistant()
        self.messages.append(message)


def _call(item: Mapping[str, Any]) -> dict[str, Any]:
    name = joined(item.get("namespace"), str(item.get("name", "")))
    if item.get("type") == "custom_tool_call":
        arguments = json.dumps({"input": str(item.get("input", ""))}, ensure_ascii=False)
    else:
        arguments = str(item.get("arguments", ""))
    return {
        "id": str(item.get("call_id", "")),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _output(item: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """The tool message of a tool output, and the images it carried (None for none)."""
    output = item.get("output", "")
    images = []
    if isinstance(output, list):
        images = [p for p in output if isinstance(p, Mapping) and p.get("type") == "input_image"]
    message = {
        "role": "tool",
        "tool_call_id": str(item.get("call_id", "")),
        "content": _text_of(output),
    }
    return message, _user_content(images, "tool output") if images else None


def _messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    chat = _Conversation()
    instructions = request.doc.get("instructions")
    if isinstance(instructions, str) and instructions:
        chat.add({"role": "system", "content": instructions})
    for i, item in enumerate(_items(request.doc)):
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES.get(str(item.get("role")))
            if role is None:
                raise BadRequest(f"input.{i}: role must be user, assistant, system or developer")
            if role == "assistant":
                turn = chat.assistant()
                if turn.get("tool_calls"):
                    chat.close_assistant()
                    turn = chat.assistant()
                turn["content"] = (turn["content"] or "") + _text_of(item.get("content"))
            elif role == "system":
                chat.add({"role": "system", "content": _text_of(item.get("content"))})
            else:
                content = _user_content(item.get("content"), f"input.{i}")
                chat.add({"role": "user", "content": content})
        elif kind in ("function_call", "custom_tool_call"):
            chat.assistant().setdefault("tool_calls", []).append(_call(item))
        elif kind in OUTPUTS:
            message, images = _output(item)
            chat.add(message)
            if images is not None:
                chat.add({"role": "user", "content": images})
    chat.close_assistant()
    return chat.messages


def _tools(tools: Any) -> tuple[list[dict[str, Any]], ToolNames]:
    out: list[dict[str, Any]] = []
    names: dict[str, ToolName] = {}

    def function(tool: Mapping[str, Any], namespace: str | None) -> None:
        custom = tool.get("type") == "custom"
        name = joined(namespace, str(tool.get("name", "")))
        spec: dict[str, Any] = {"name": name}
        if tool.get("description"):
            spec["description"] = tool["description"]
        if custom:
            spec["parameters"] = _CUSTOM_PARAMETERS
        else:
            spec["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
            if isinstance(tool.get("strict"), bool):
                spec["strict"] = tool["strict"]
        out.append({"type": "function", "function": spec})
        if namespace or custom:
            names[name] = ToolName(str(tool.get("name", "")), namespace, custom)

    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping):
            continue
        if tool.get("type") in ("function", "custom"):
            function(tool, None)
        elif tool.get("type") == "namespace":
            for inner in tool.get("tools") or ():
                if isinstance(inner, Mapping) and inner.get("type") in ("function", "custom"):
                    function(inner, str(tool.get("name", "")))
    return out, ToolNames(names)


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") in ("function", "custom"):
        name = joined(choice.get("namespace"), str(choice.get("name", "")))
        return {"type": "function", "function": {"name": name}}
    return None


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if not isinstance(fmt, Mapping):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return None


def to_chat(request: ResponsesRequest) -> tuple[dict[str, Any], ToolNames]:
    """The request as a Chat Completions request (see the module docstring), and the names
    its tools got there; `BadRequest` for content that has no Chat Completions form."""
    doc = request.doc
    chat: dict[str, Any] = {"model": request.model, "messages": _messages(request)}
    if request.max_tokens:
        chat["max_tokens"] = request.max_tokens
    for name in ("temperature", "top_p"):
        if isinstance(doc.get(name), int | float) and not isinstance(doc.get(name), bool):
            chat[name] = doc[name]
    tools, names = _tools(doc.get("tools"))
    if tools:
        chat["tools"] = tools
        choice = _tool_choice(doc.get("tool_choice"))
        if choice is not None:
            chat["tool_choice"] = choice
        if isinstance(doc.get("parallel_tool_calls"), bool):
            chat["parallel_tool_calls"] = doc["parallel_tool_calls"]
    response_format = _response_format(doc.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    if request.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat, names
