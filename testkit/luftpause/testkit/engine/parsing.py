"""Request validation for the simulator's HTTP face, and the error a client sees.

Pure module: bytes and dicts in, values or `HttpError` out.

Failure injection (request header `x-sim-fail`, for failure tests):
  `<status>`        answer that status (400..599) at once, with OpenAI's error body and
                    `Retry-After: 1`; no engine work is done
  `midstream[:N]`   start the reply, then cut the connection after N token chunks (default 3;
                    a non-streamed reply is cut after part of its body), as a crashed engine would
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from luftpause.testkit.engine.params import TOOL_STYLES, SimParams, ToolStyle


class HttpError(Exception):
    """An answer other than 200, with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.code = code
        self.headers: dict[str, str] = {}


def too_long(window: int, prompt: int, reply: int) -> HttpError:
    """OpenAI's refusal of a prompt plus reply longer than the context window."""
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt + reply} tokens ({prompt} in the messages, {reply} in the completion). "
        "Please reduce the length of the messages or completion."
    )
    return HttpError(400, message, "invalid_request_error", "context_length_exceeded")


FAIL_HEADER = "x-sim-fail"
MIDSTREAM_DEFAULT_CHUNKS = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """An injected failure: refuse with `status`, or cut the reply after `after_chunks`."""

    status: int | None = None
    after_chunks: int = MIDSTREAM_DEFAULT_CHUNKS

    @property
    def midstream(self) -> bool:
        return self.status is None


def parse_failure(value: str | None) -> Failure | None:
    """The failure asked for by an `x-sim-fail` header value, or None."""
    if value is None:
        return None
    text = value.strip().lower()
    if text.isdigit():
        status = int(text)
        if not 400 <= status <= 599:
            raise HttpError(400, "x-sim-fail: a status must be within 400..599.")
        return Failure(status=status)
    kind, colon, count = text.partition(":")
    if kind != "midstream":
        raise HttpError(400, "x-sim-fail must be a status or midstream[:N].")
    if not colon:
        return Failure()
    if not count.isdigit():
        raise HttpError(400, "x-sim-fail: midstream:N needs a whole number N.")
    return Failure(after_chunks=int(count))


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int
    tool_rounds: int
    top_logprobs: int | None
    tool_style: ToolStyle = "openai"
    fail: Failure | None = None
    priority: int = 0


def decode_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"Invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise HttpError(400, "The request body must be a JSON object.")
    return body


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HttpError(400, f"{what} must be a positive integer.")
    return value


def parse_chat(body: dict[str, Any], headers: Mapping[str, str], params: SimParams) -> ChatRequest:
    """Validate a chat request body and pick out what the simulator uses."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "'messages' is required and must be a non-empty list.")
    if not all(isinstance(m, dict) for m in messages):
        raise HttpError(400, "Each message must be an object.")
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list)
        and all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)
    ):
        raise HttpError(400, '\'tools\' must be a list of {"type": "function", ...} objects.')
    raw_max = body.get("max_completion_tokens") or body.get("max_tokens")
    max_tokens = (
        params.default_max_tokens if raw_max is None else _positive_int(raw_max, "max_tokens")
    )
    rounds = headers.get("x-sim-tool-rounds")
    try:
        tool_rounds = params.tool_rounds if rounds is None else int(rounds)
    except ValueError as exc:
        raise HttpError(400, "x-sim-tool-rounds must be an integer.") from exc
    tool_style = headers.get("x-sim-tool-style", params.tool_style).strip().lower()
    if tool_style not in TOOL_STYLES:
        raise HttpError(400, "x-sim-tool-style must be openai or text.")
    top = None
    if body.get("logprobs"):
        raw_top = body.get("top_logprobs") or 0
        if isinstance(raw_top, bool) or not isinstance(raw_top, int) or not 0 <= raw_top <= 20:
            raise HttpError(400, "top_logprobs must be an integer within 0..20.")
        top = raw_top
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise HttpError(400, "'priority' must be an integer.")
    options = body.get("stream_options") or {}
    return ChatRequest(
        body=body,
        model=str(body.get("model") or params.model),
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        max_tokens=max_tokens,
        tool_rounds=tool_rounds,
        tool_style=tool_style,
        top_logprobs=top,
        fail=parse_failure(headers.get(FAIL_HEADER)),
        priority=priority,
    )


def parse_classify(body: dict[str, Any]) -> list[str]:
    """The texts of a /classify request: `input` is a string or a list of strings."""
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise HttpError(400, "'input' must be a string or a non-empty list of strings.")
    return texts
