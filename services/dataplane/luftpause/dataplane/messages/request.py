"""A Messages API request: its checks, what the turn path reads of it, and Chat Completions.

Pure module: no I/O. `read_request` checks what the dataplane relies on (Anthropic's own rules
for those fields: `model`, a non-empty `messages`, a positive `max_tokens`, `stream`) and keeps
the parsed document; `echoed_ids` are the `tool_use_id`s of its `tool_result` blocks, by which a
run without a run header is recognised; `to_chat` is the same request in Chat Completions terms,
for an engine that does not serve the Messages API itself:

    system (a string or text blocks)   -> a first `system` message, blocks joined by blank lines
    a message of role system           -> a `system` message (Claude Code sends these)
    user text / image blocks           -> a `user` message with text and `image_url` parts
    user tool_result blocks            -> one `tool` message each, before the user's other
                                          content; images in a result follow as a user message
    assistant text / tool_use blocks   -> one `assistant` message with `tool_calls`
    thinking, redacted_thinking        -> dropped (an engine's chat template cannot take them)
    tools (custom)                     -> `function` tools; Anthropic's own tool types (bash_*,
                                          web_search_* ...) have no schema to send and are left out
    tool_choice auto | any | tool | none  -> auto | required | the function | none;
                                          disable_parallel_tool_use -> parallel_tool_calls false
    stop_sequences                     -> stop
    stream                             -> stream, with stream_options.include_usage
    max_tokens, temperature, top_p     -> the same

`cache_control`, `metadata`, `thinking`, `context_management`, `output_config`, `top_k` and
`service_tier` have no Chat Completions counterpart and are not sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.forwarding import parse_json_object, require_model, stream_flag

ROLES = frozenset({"user", "assistant", "system"})


@dataclass(frozen=True, slots=True, kw_only=True)
class MessagesRequest:
    """A checked Messages API request."""

    doc: Mapping[str, Any]
    model: str
    max_tokens: int
    stream: bool

    @property
    def messages(self) -> list[Any]:
        return list(self.doc["messages"])


def read_request(body: bytes, *, counting: bool = False) -> MessagesRequest:
    """The request in `body`; `BadRequest` if it breaks the API's rules for the fields read
    here. `counting` (`/v1/messages/count_tokens`) needs no `max_tokens`."""
    doc = parse_json_object(body)
    model = require_model(doc)
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ROLES:
            raise BadRequest(f"messages.{i}: must be an object with role user or assistant")
        if not isinstance(message.get("content"), str | list):
            raise BadRequest(f"messages.{i}.content: must be a string or a list of blocks")
    system = doc.get("system")
    if system is not None and not isinstance(system, str | list):
        raise BadRequest("system: must be a string or a list of text blocks")
    if doc.get("tools") is not None and not isinstance(doc["tools"], list):
        raise BadRequest("tools: must be a list")
    max_tokens = doc.get("max_tokens")
    if not counting and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise BadRequest("max_tokens: must be a positive integer")
    return MessagesRequest(
        doc=doc,
        model=model,
        max_tokens=max_tokens if isinstance(max_tokens, int) else 0,
        stream=stream_flag(doc),
    )


def _blocks(content: Any) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def echoed_ids(doc: Mapping[str, Any]) -> Iterator[str]:
    """The `tool_use_id`s of the request's tool results, latest first."""
    for message in reversed(doc["messages"]):
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue
        for block in reversed(_blocks(message["content"])):
            if block.get("type") == "tool_result":
                call_id = block.get("tool_use_id")
                if isinstance(call_id, str) and call_id:
                    yield call_id


def opening(doc: Mapping[str, Any]) -> tuple[list[Any], Any]:
    """The parts of the request's opening (its system prompt, then messages) and its tools."""
    system = doc.get("system")
    return ([system] if system else []) + list(doc["messages"]), doc.get("tools")


def _joined_text(content: Any) -> str:
    return "\n\n".join(str(b.get("text", "")) for b in _blocks(content) if b.get("type") == "text")


def _image_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    source = source if isinstance(source, Mapping) else {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = str(source.get("url", ""))
    else:
        raise BadRequest(f"{where}: an image needs a base64 or url source to translate")
    return {"type": "image_url", "image_url": {"url": url}}


def _user_parts(block: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    kind = block.get("type")
    if kind == "text":
        return [{"type": "text", "text": str(block.get("text", ""))}]
    if kind == "image":
        return [_image_part(block, where)]
    if kind == "document":
        source = block.get("source")
        if isinstance(source, Mapping) and source.get("type") == "text":
            return [{"type": "text", "text": str(source.get("data", ""))}]
        raise BadRequest(
            f"{where}: only text documents can be translated to Chat Completions "
            "(this engine does not serve the Messages API)"
        )
    return []  # thinking and server tool blocks: nothing an engine's chat template takes


def _tool_result(block: Mapping[str, Any], where: str) -> tuple[dict[str, Any], list[Any]]:
    """The tool message of a `tool_result`, and the image parts it carried."""
    text: list[str] = []
    images: list[Any] = []
    for j, part in enumerate(_blocks(block.get("content", ""))):
        if part.get("type") == "image":
            images.append(_image_part(part, f"{where}.content.{j}"))
        elif part.get("type") == "text":
            text.append(str(part.get("text", "")))
    message = {
        "role": "tool",
        "tool_call_id": str(block.get("tool_use_id", "")),
        "content": "\n\n".join(text),
    }
    return message, images


def _user(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    if isinstance(message["content"], str):
        return [{"role": "user", "content": message["content"]}]
    out: list[dict[str, Any]] = []
    parts: list[Any] = []
    for j, block in enumerate(_blocks(message["content"])):
        if block.get("type") == "tool_result":
            tool, images = _tool_result(block, f"{where}.content.{j}")
            out.append(tool)
            parts += images
        else:
            parts += _user_parts(block, f"{where}.content.{j}")
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "\n\n".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _assistant(message: Mapping[str, Any]) -> dict[str, Any]:
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in _blocks(message["content"]):
        if block.get("type") == "text":
            text.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            arguments = block.get("input", {})
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name", "")),
                        "arguments": json.dumps(arguments, ensure_ascii=False),
                    },
                }
            )
    if not calls:
        return {"role": "assistant", "content": "".join(text)}
    return {"role": "assistant", "content": "".join(text) or None, "tool_calls": calls}


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping) or tool.get("type", "custom") != "custom":
            continue  # Anthropic's own tool types: no schema to hand an engine
        function: dict[str, Any] = {
            "name": str(tool.get("name", "")),
            "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
        }
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    if not isinstance(choice, Mapping):
        return {}
    out: dict[str, Any] = {}
    kind = choice.get("type")
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name", "")}}
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def to_chat(request: MessagesRequest) -> dict[str, Any]:
    """The request as a Chat Completions request (see the module docstring); `BadRequest` for
    content that has no Chat Completions form."""
    doc = request.doc
    messages: list[dict[str, Any]] = []
    system = doc.get("system")
    if system:
        text = system if isinstance(system, str) else _joined_text(system)
        messages.append({"role": "system", "content": text})
    for i, message in enumerate(doc["messages"]):
        role = message["role"]
        if role == "system":
            messages.append({"role": "system", "content": _joined_text(message["content"])})
        elif role == "user":
            messages += _user(message, f"messages.{i}")
        else:
            messages.append(_assistant(message))
    chat: dict[str, Any] = {"model": request.model, "messages": messages}
    if request.max_tokens:
        chat["max_tokens"] = request.max_tokens
    for name in ("temperature", "top_p"):
        if isinstance(doc.get(name), int | float) and not isinstance(doc.get(name), bool):
            chat[name] = doc[name]
    stop = doc.get("stop_sequences")
    if isinstance(stop, list) and stop:
        chat["stop"] = [str(s) for s in stop]
    tools = _tools(doc.get("tools"))
    if tools:
        chat["tools"] = tools
        chat.update(_tool_choice(doc.get("tool_choice")))
    if request.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat
