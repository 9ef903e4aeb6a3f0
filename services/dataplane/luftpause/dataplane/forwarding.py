"""What crosses the proxy: the request body's checks and the headers each way.

Pure module: no I/O. The body itself is never re-serialised: it is parsed only to check it
and find the model and messages, and the client's bytes go upstream unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from luftpause.dataplane.errors import BadRequest

RUN_ID_HEADER = "x-luftpause-run-id"
CLASS_HEADER = "x-luftpause-class"
CALLER_HEADER = "x-luftpause-caller"

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Accept-Encoding is replaced by identity: the reply must be readable on its way through. The
# client's credentials (Authorization, and x-api-key as Anthropic's SDK sends it) are for
# luftpause, never for the engine.
_NOT_UPSTREAM = _HOP_BY_HOP | {
    "authorization",
    "x-api-key",
    "host",
    "content-length",
    "accept-encoding",
    "expect",
}
_NOT_DOWNSTREAM = _HOP_BY_HOP | {"content-length", "date", "server"}


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object; `BadRequest` if it is anything else."""
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object")
    return doc


def require_model(doc: Mapping[str, Any]) -> str:
    """The request's `model`; `BadRequest` unless a non-empty string."""
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string")
    return model


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def stream_flag(doc: Mapping[str, Any]) -> bool:
    """The request's `stream`; `BadRequest` unless true, false or absent."""
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false")
    return bool(stream)


def count_field(doc: Mapping[str, Any], name: str) -> int:
    """The non-negative integer field `name` (0 when absent or null); `BadRequest` if another
    value."""
    value = doc.get(name)
    if value is not None and not (_is_int(value) and value >= 0):
        raise BadRequest(f"'{name}' must be a non-negative integer")
    return value or 0


class TurnBody(NamedTuple):
    """What the dataplane reads of a chat completion request."""

    model: str
    messages: list[Any]
    tools: Any = None
    # max_completion_tokens, else max_tokens; 0 when it sets neither.
    max_tokens: int = 0


def parse_turn_body(body: bytes) -> TurnBody:
    """The model, messages and tools of a chat completion request; `BadRequest` if malformed.

    Checked: what the dataplane reads (model, messages) and the obviously wrong types of the
    fields that decide how the reply comes back (stream, max_tokens); the rest is the engine's.
    """
    doc = parse_json_object(body)
    model = require_model(doc)
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    if not all(isinstance(m, dict) for m in messages):
        raise BadRequest("every entry of 'messages' must be an object")
    stream_flag(doc)
    plain, newer = count_field(doc, "max_tokens"), count_field(doc, "max_completion_tokens")
    return TurnBody(model, messages, doc.get("tools"), newer or plain)


def with_fields(body: bytes, fields: Mapping[str, int]) -> bytes:
    """`body` (a JSON object already checked by `parse_turn_body`) with integer `fields` set
    (the engine's `priority`, llama.cpp's `id_slot`).

    The fields go in right after the opening brace, so the bytes need no re-encoding; only a
    body that may carry one of them already is decoded and encoded again, so that ours replaces
    the client's instead of following it as a duplicate key.
    """
    if not fields:
        return body
    if any(b'"%s"' % name.encode() in body for name in fields):
        doc = json.loads(body)
        doc.update(fields)
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    start = body.index(b"{") + 1
    rest = body[start:].lstrip()
    head = b",".join(b'"%s":%d' % (name.encode(), value) for name, value in fields.items())
    sep = b"" if rest.startswith(b"}") else b","
    return b"{%s%s%s" % (head, sep, rest)


def upstream_headers(
    client: Iterable[tuple[str, str]], api_key: str, key_header: str = "authorization"
) -> dict[str, str]:
    """The client's end-to-end headers minus its credentials and ours, plus the engine's key:
    as a bearer, or in `x-api-key` for an endpoint whose `key_header` says so (Anthropic's)."""
    headers: dict[str, str] = {}
    has_type = False
    for name, value in client:
        low = name.lower()
        if low in _NOT_UPSTREAM or low.startswith("x-luftpause-"):
            continue
        if not _encodable(value):
            continue  # bytes that were not UTF-8 (surrogate escapes): not ours to pass on
        has_type = has_type or low == "content-type"
        headers[name] = value
    if not has_type:
        headers["Content-Type"] = "application/json"
    headers["Accept-Encoding"] = "identity"
    if api_key and key_header == "x-api-key":
        headers["x-api-key"] = api_key
    elif api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _encodable(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def downstream_headers(engine: Iterable[tuple[str, str]], run_id: str) -> list[tuple[str, str]]:
    """The engine's end-to-end headers (Retry-After, rate limits, ...) plus the run id (none
    when `run_id` is empty: a request outside any run)."""
    headers = [(name, value) for name, value in engine if name.lower() not in _NOT_DOWNSTREAM]
    if run_id:
        headers.append((RUN_ID_HEADER, run_id))
    return headers


def is_event_stream(headers: Mapping[str, str]) -> bool:
    """True if the engine answered with server-sent events."""
    return headers.get("Content-Type", "").startswith("text/event-stream")
