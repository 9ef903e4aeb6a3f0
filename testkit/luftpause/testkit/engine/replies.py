"""Writing a chat reply to its client: the SSE stream, and the injected cuts.

Shell layer: writes to aiohttp responses; the frames come from `wire`, the tokens from the
`EngineDriver` handle. A stream sends the first token at once, then one frame per
`stream_interval` tokens (SGLang's `--stream-interval`), then the last partial group
(`wire.flush_after` decides). An injected cut (`x-sim-fail: midstream[:N]`) drops the
connection after N token frames, or half way through a non-streamed body.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.driver import Handle
from luftpause.testkit.engine.parsing import ChatRequest, Failure
from luftpause.testkit.engine.script import Reply


def cut(request: web.Request) -> None:
    """Drop the connection at once, with no proper end of the reply: a crashed engine."""
    if request.transport is not None:
        request.transport.abort()


async def cut_body(
    request: web.Request, body: bytes, headers: dict[str, str]
) -> web.StreamResponse:
    """Announce the whole JSON body, send half of it, then drop the connection."""
    resp = web.StreamResponse(headers={"Content-Type": "application/json", **headers})
    resp.content_length = len(body)
    await resp.prepare(request)
    await resp.write(body[: len(body) // 2])
    cut(request)
    return resp


def cut_point(fail: Failure | None) -> int | None:
    """After how many token frames a stream is cut, or None for a whole reply."""
    return fail.after_chunks if fail is not None and fail.midstream else None


async def stream(
    request: web.Request,
    handle: Handle,
    env: wire.Envelope,
    reply: Reply,
    chat: ChatRequest,
    headers: dict[str, str],
    interval: int,
    respond: Callable[[dict[str, str]], web.StreamResponse] | None = None,
) -> web.StreamResponse:
    """Stream the reply as its tokens are emitted, `interval` tokens per frame after the first,
    to the response `respond` makes from the headers (one that writes another API, `doors`)."""
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    resp = web.StreamResponse(headers=headers) if respond is None else respond(headers)
    await resp.prepare(request)
    assert handle.tokens is not None
    cut_at = cut_point(chat.fail)
    total = handle.sub.output_tokens
    frames = start = 0
    try:
        for _ in range(total):
            if frames == cut_at:
                break
            index = await handle.tokens.get()
            if wire.flush_after(index, total, interval):
                await resp.write(wire.tokens_chunk(env, reply, start, index + 1, chat.top_logprobs))
                start, frames = index + 1, frames + 1
        if cut_at is not None:
            cut(request)
            return resp
        await handle.done
        await resp.write(wire.finish_chunk(env, reply.finish_reason))
        if chat.include_usage:
            use = wire.usage(
                prompt=len(handle.sub.prompt), completion=handle.generated, cached=handle.cached
            )
            await resp.write(wire.usage_chunk(env, use))
        await resp.write(wire.DONE)
        await resp.write_eof()
    except ConnectionError:
        pass  # the client left; the caller's `finally` aborts the request
    return resp
