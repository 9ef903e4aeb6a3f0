"""OpenAI- and vLLM-shaped JSON bodies and SSE frames.

Pure module: builds dicts and bytes from values; ids and timestamps come in from the caller.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from luftpause.testkit.engine.params import SimParams
from luftpause.testkit.engine.script import Reply, ToolCall, token_logprobs

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


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def completion(
    env: Envelope, reply: Reply, generated: int, use: dict[str, Any], top_logprobs: int | None
) -> dict[str, Any]:
    """A non-streamed chat completion."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [_tool_call(call) for call in reply.generated_calls()]
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


def flush_after(index: int, total: int, interval: int) -> bool:
    """Whether a stream sends a frame once token `index` (of `total`) is generated.

    As SGLang with `--stream-interval N`: the first token at once, then every N tokens, and the
    last one; with N = 1, every token.
    """
    return index % interval == 0 or index == total - 1


def token_chunk(env: Envelope, reply: Reply, index: int, top_logprobs: int | None) -> bytes:
    """The SSE frame of generated token `index`."""
    return tokens_chunk(env, reply, index, index + 1, top_logprobs)


def tokens_chunk(
    env: Envelope, reply: Reply, start: int, stop: int, top_logprobs: int | None
) -> bytes:
    """One SSE frame carrying generated tokens `start` to `stop` (exclusive)."""
    delta: dict[str, Any]
    if not reply.tool_calls:
        text = "".join(reply.pieces[start:stop])
        delta = {"role": "assistant", "content": text} if start == 0 else {"content": text}
    else:
        calls = []
        for span in reply.calls_in(start, stop):
            if span.opens:  # the call's first token: its id and name come with it
                call = _tool_call(
                    ToolCall(id=span.call.id, name=span.call.name, arguments=span.text)
                )
                calls.append({"index": span.index, **call})
            else:
                calls.append({"index": span.index, "function": {"arguments": span.text}})
        delta = {"tool_calls": calls}
        if start == 0:
            delta = {"role": "assistant", "content": None, **delta}
    logprobs = None
    if top_logprobs is not None:
        logprobs = {"content": [token_logprobs(reply, i, top_logprobs) for i in range(start, stop)]}
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}
    return sse(_chunk(env, choice))


def finish_chunk(env: Envelope, finish_reason: str) -> bytes:
    choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}
    return sse(_chunk(env, choice))


def usage_chunk(env: Envelope, use: dict[str, Any]) -> bytes:
    body = _chunk(env, None)
    body["usage"] = use
    return sse(body)


def server_info(params: SimParams) -> dict[str, Any]:
    """SGLang's /server_info body (its names, top level), as far as the simulator has them."""
    engine = params.engine
    return {
        "model_path": params.model,
        "max_total_num_tokens": engine.pool_tokens,
        "max_running_requests": engine.max_running,
        "max_prefill_tokens": engine.max_prefill_tokens,
        "page_size": engine.block_size,
        "stream_interval": params.stream_interval,
        "admission": engine.admission,
    }


def models(model: str, created: int, owner: str, window: int | None = None) -> dict[str, Any]:
    """`GET /v1/models`; with a context window, as vLLM says it (`max_model_len`)."""
    entry: dict[str, Any] = {"id": model, "object": "model", "created": created, "owned_by": owner}
    if window is not None:
        entry["max_model_len"] = window
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
