"""The three APIs a turn comes in by, and each one's error shape.

Pure module: no I/O. A turn arrives by OpenAI Chat Completions, Anthropic's Messages API (Claude
Code's) or OpenAI's Responses API (Codex's), each on its own path; `Api` names them as the
endpoint file's `apis` does. Whatever the failure, a client gets the error body its own API
defines, so its SDK raises the error it knows:

    chat, responses   {"error": {"message": ...}}                                  (OpenAI)
    messages          {"type": "error", "error": {"type": <by status>, "message": ...}}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class Api(StrEnum):
    """An API a client speaks and an engine may serve (the endpoint file's names)."""

    CHAT = "chat"
    MESSAGES = "messages"
    RESPONSES = "responses"


PATHS = {
    Api.CHAT: "/v1/chat/completions",
    Api.MESSAGES: "/v1/messages",
    Api.RESPONSES: "/v1/responses",
}
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
TITLES = {
    Api.CHAT: "Chat Completions",
    Api.MESSAGES: "the Messages API",
    Api.RESPONSES: "the Responses API",
}
CHAT_ONLY = frozenset({Api.CHAT})

# Anthropic's error types by HTTP status (its "Errors" page); any other 5xx is an api_error.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def api_of(path: str) -> Api:
    """The API a request path belongs to (Chat Completions for every path not another's)."""
    if path.startswith("/v1/messages"):
        return Api.MESSAGES
    if path.startswith("/v1/responses"):
        return Api.RESPONSES
    return Api.CHAT


def apis_of(names: frozenset[str] | set[str]) -> frozenset[Api]:
    """The endpoint file's `apis` names as values (already checked by the config loader)."""
    return frozenset(Api(name) for name in names)


def error_document(api: Api, status: int, message: str) -> dict[str, Any]:
    """The error body `api` defines for `status`."""
    if api is Api.MESSAGES:
        kind = _ANTHROPIC_TYPES.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message}}


def error_body(api: Api, status: int, message: str) -> bytes:
    """`error_document` as JSON bytes."""
    return json.dumps(error_document(api, status, message)).encode()


def error_message(body: bytes) -> str:
    """The message of an engine's error body (OpenAI's, Anthropic's or plain text)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:1000]
    error = doc.get("error") if isinstance(doc, Mapping) else None
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    if isinstance(doc, Mapping) and isinstance(doc.get("message"), str):
        return str(doc["message"])
    return body.decode("utf-8", "replace").strip()[:1000]
