"""An engine's reply on its way to the client: its refusal, its whole body, or its stream.

Shell module: the last step of a turn's path (`proxy`). What the client gets is the reply's
`Upstream` codec's doing (`doors`): the engine's bytes as they are, or translated into the
client's API; either way the turn's facts are read on the way and reported through `Turn`.

- A refusal (not 2xx): its status and headers (Retry-After, rate limits) and its body, in the
  client's API's error shape when translated.
- A whole body: read, then sent at once.
- A stream: headers at once, then each engine chunk as it comes (translated chunk by chunk),
  observed after it is sent. An engine that breaks off mid-stream leaves the client what it got,
  and the connection is closed without the stream's end, which tells the client it broke.
"""

from __future__ import annotations

import time

import structlog
from aiohttp import web

from luftpause.dataplane.apis import Api
from luftpause.dataplane.context import Dataplane
from luftpause.dataplane.doors import Upstream
from luftpause.dataplane.errors import EngineStreamBroken
from luftpause.dataplane.forwarding import downstream_headers, is_event_stream
from luftpause.dataplane.middleware import json_error
from luftpause.dataplane.transport import EngineResponse
from luftpause.dataplane.turn import Turn

CLIENT_GONE = "client disconnected"

log = structlog.get_logger("luftpause.dataplane.relay")


async def relay(
    request: web.Request,
    dp: Dataplane,
    turn: Turn,
    engine: EngineResponse,
    upstream: Upstream,
    api: Api,
    timing: tuple[float, float],
) -> web.StreamResponse:
    """The reply to the client of `api`; `timing` is the turn's arrival (perf_counter) and the
    dataplane's own share of the time to first byte so far."""
    if not 200 <= engine.status < 300:
        return await _refusal(turn, engine, upstream, api)
    if not is_event_stream(engine.headers):
        return await _body(dp, turn, engine, upstream, api, timing)
    dp.metrics.open_streams += 1
    try:
        return await _stream(request, dp, turn, engine, upstream, timing)
    finally:
        dp.metrics.open_streams -= 1


async def _refusal(
    turn: Turn, engine: EngineResponse, upstream: Upstream, api: Api
) -> web.Response:
    """429, 5xx, 4xx: the engine's status, headers (Retry-After) and body."""
    try:
        data = await engine.read()
    except EngineStreamBroken as exc:
        return _broke_off(turn, api, f"engine status {engine.status}, body broke off", exc)
    turn.response_bytes = len(data)
    turn.failed(f"engine status {engine.status}")
    headers = downstream_headers(engine.headers.items(), turn.run_id)
    if upstream.refusal is not None:
        data = upstream.refusal(engine.status, data)
        headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
        headers.append(("Content-Type", "application/json"))
    return web.Response(status=engine.status, body=data, headers=headers)


async def _body(
    dp: Dataplane,
    turn: Turn,
    engine: EngineResponse,
    upstream: Upstream,
    api: Api,
    timing: tuple[float, float],
) -> web.Response:
    arrived, own = timing
    try:
        data = await engine.read()
        received = time.perf_counter()
        body, summary = upstream.whole(data)
    except EngineStreamBroken as exc:
        log.warning("engine reply broke off", replica=turn.replica_id, error=exc.message)
        return _broke_off(turn, api, "engine reply broke off", exc)
    except ValueError:
        turn.response_bytes = len(data)
        turn.failed("engine reply is not a chat completion")
        message = f"engine {turn.replica_id}: its reply is not a chat completion"
        return json_error(502, message, run_id=turn.run_id, api=api)
    turn.response_bytes = len(data)
    turn.finished(summary)
    now = time.perf_counter()
    dp.metrics.first_byte(turn.service_class, now - arrived, own + now - received)
    if turn.span is not None:
        turn.span.first_byte(now - arrived)
    return web.Response(
        status=engine.status,
        body=body,
        headers=downstream_headers(engine.headers.items(), turn.run_id),
    )


async def _stream(
    request: web.Request,
    dp: Dataplane,
    turn: Turn,
    engine: EngineResponse,
    upstream: Upstream,
    timing: tuple[float, float],
) -> web.StreamResponse:
    """Headers at once, then every engine chunk (as the client's API writes it) as it comes."""
    arrived, own = timing
    resp = web.StreamResponse(
        status=engine.status, headers=downstream_headers(engine.headers.items(), turn.run_id)
    )
    await resp.prepare(request)
    stream = upstream.stream()
    received = 0.0
    sent = 0  # engine bytes read (what the turn reports)
    wrote = told = False
    calls = 0  # tool call ids remembered so far
    try:
        while chunk := await engine.read_chunk():
            if not sent:
                received = time.perf_counter()
            sent += len(chunk)
            out = stream.feed(chunk)
            if len(stream.call_ids) > calls:
                turn.calls_seen(stream.call_ids[calls:])
                calls = len(stream.call_ids)
            if out:
                await resp.write(out)
                if not wrote:
                    wrote = True
                    _first_byte(dp, turn, arrived, own, received)
            if not told and stream.first_token:
                told = True
                turn.first_token()  # after the chunk that carried it went out
    except EngineStreamBroken as exc:
        log.warning("engine stream broke off", replica=turn.replica_id, error=exc.message)
        turn.response_bytes = sent
        turn.failed(f"engine stream broke off: {exc.message}")
        # The client keeps what it got; closing without the last chunk tells it the reply broke.
        if request.transport is not None:
            request.transport.close()
        return resp
    except ConnectionError:
        turn.response_bytes = sent
        turn.failed(CLIENT_GONE)
        return resp
    try:
        tail = stream.flush()
        turn.calls_seen(stream.call_ids[calls:])
        if tail:
            await resp.write(tail)
    except ConnectionError:
        turn.response_bytes = sent
        turn.failed(CLIENT_GONE)
        return resp
    if stream.first_token:
        turn.first_token()
    turn.response_bytes = sent
    turn.finished(stream.summary())
    await resp.write_eof()
    return resp


def _broke_off(turn: Turn, api: Api, what: str, exc: EngineStreamBroken) -> web.Response:
    """The turn failed as the engine's body broke off: the client's 502."""
    turn.failed(f"{what}: {exc.message}")
    message = f"engine {turn.replica_id}: {exc.message}"
    return json_error(502, message, run_id=turn.run_id, api=api)


def _first_byte(dp: Dataplane, turn: Turn, arrived: float, own: float, received: float) -> None:
    """The first bytes went to the client: what the wait took, and the dataplane's share."""
    now = time.perf_counter()
    dp.metrics.first_byte(turn.service_class, now - arrived, own + now - received)
    if turn.span is not None:
        turn.span.first_byte(now - arrived)
