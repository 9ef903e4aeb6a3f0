"""OpenAI- and vLLM-shaped JSON bodies and SSE frames.

Pure module: builds dicts and bytes from values; ids and timestamps come in from the caller.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from luftpause.testkit.engine.script import Reply, token_logprobs

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """Fields every chat response and chunk repeats."""

    id: str
    created: int
    model: str
    fingerprint: str


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def error(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def usage(*, prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _tool_call(reply: Reply) -> dict[str, Any]:
    assert reply.tool_call is not None
    return {
        "id": reply.tool_call.id,
        "type": "function",
        "function": {"name": reply.tool_call.name, "arguments": reply.arguments},
    }


def completion(
    env: Envelope, reply: Reply, generated: int, use: dict[str, Any], top_logprobs: int | None
) -> dict[str, Any]:
    """A non-streamed chat completion."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_call is not None:
        message["tool_calls"] = [_tool_call(reply)]
    logprobs = None
    if top_logprobs is not None:
        logprobs = {"content": [token_logprobs(reply, i, top_logprobs) for i in range(generated)]}
    return {
        "id": env.id,
        "object": "chat.completion",
        "created": env.created,
        "model": env.model,
        "system_fingerprint": env.fingerprint,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": reply.finish_reason,
            }
        ],
        "usage": use,
    }


def _chunk(env: Envelope, choice: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": env.id,
        "object": "chat.completion.chunk",
        "created": env.created,
        "model": env.model,
        "system_fingerprint": env.fingerprint,
        "choices": [] if choice is None else [choice],
    }


def token_chunk(env: Envelope, reply: Reply, index: int, top_logprobs: int | None) -> bytes:
    """The SSE frame of generated token `index`."""
    piece = reply.pieces[index]
    delta: dict[str, Any]
    if reply.tool_call is None:
        delta = {"role": "assistant", "content": piece} if index == 0 else {"content": piece}
    elif index == 0:
        call = _tool_call(reply)
        call["index"] = 0
        call["function"]["arguments"] = ""
        delta = {"role": "assistant", "content": None, "tool_calls": [call]}
    else:
        delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
    logprobs = None
    if top_logprobs is not None:
        logprobs = {"content": [token_logprobs(reply, index, top_logprobs)]}
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}
    return sse(_chunk(env, choice))


def finish_chunk(env: Envelope, finish_reason: str) -> bytes:
    choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}
    return sse(_chunk(env, choice))


def usage_chunk(env: Envelope, use: dict[str, Any]) -> bytes:
    body = _chunk(env, None)
    body["usage"] = use
    return sse(body)


def models(model: str, created: int, owner: str) -> dict[str, Any]:
    entry = {"id": model, "object": "model", "created": created, "owned_by": owner}
    return {"object": "list", "data": [entry]}


def classification(
    *,
    id: str,
    created: int,
    model: str,
    labels: Sequence[str],
    probs: Sequence[Sequence[float]],
    prompt_tokens: int,
) -> dict[str, Any]:
    """vLLM's /classify response."""
    data = [
        {
            "index": i,
            "label": labels[max(range(len(p)), key=p.__getitem__)],
            "probs": list(p),
            "num_classes": len(labels),
        }
        for i, p in enumerate(probs)
    ]
    return {
        "id": id,
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 0,
            "total_tokens": prompt_tokens,
            "prompt_tokens_details": None,
        },
    }
