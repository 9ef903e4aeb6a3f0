"""`POST /v1/chat/completions`: one agent turn through the scheduler to an engine and back.

Shell module, kept thin: the decisions live in `identity`, `forwarding`, `sse`, `reply`, and the
bookkeeping in `turn`. Per turn: read and check the body, resolve the run, class and caller,
place it (on an open replica by `local`'s rule, reported; else Admit, held until placed), report
started, send the client's bytes to the replica, relay the reply's bytes unchanged while
observing it, report the end.

`started` is reported right before the request goes to the engine: after the Admit reply and
the check that the client is still there, and before a saved slot context is moved (see
`slotfiles`). So it precedes every outcome (a refused connection gives started + failed, as does
a 429) and marks, for stream and non-stream turns alike, when
the scheduler's hold ended and the engine's work began; `first_token` is reported for streams
only, after the chunk that carried it was sent on.

Client disconnects are detected by aiohttp cancelling this handler (the server runs with
`handler_cancellation=True`) or by a write failing; in both cases the `finally` blocks close the
engine response (its socket, so the engine stops) and end the turn (abandoned while held,
failed once placed).

The dataplane's own share of the time to first byte (`Metrics.first_byte`'s `added`) is the
time from the request's arrival to the request going to the engine, less the waits for others
(the scheduler's placement, hold included, and saved slot calls to the engine), plus the time
from the engine's first body bytes arriving to their being sent on.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from typing import TYPE_CHECKING
from uuid import uuid4

import structlog
from aiohttp import web

from luftpause.common import ratelimits
from luftpause.common.prefixes import Key, opening_keys
from luftpause.dataplane import wire
from luftpause.dataplane.context import DATAPLANE, Dataplane
from luftpause.dataplane.errors import (
    BodyTooLarge,
    DataplaneError,
    EngineStreamBroken,
    EngineUnreachable,
    ModelNotFound,
    RateLimited,
    SchedulerError,
)
from luftpause.dataplane.forwarding import (
    CLASS_HEADER,
    RUN_ID_HEADER,
    downstream_headers,
    is_event_stream,
    parse_turn_body,
    upstream_headers,
    with_fields,
)
from luftpause.dataplane.identity import echoed_tool_call_ids, parse_service_class
from luftpause.dataplane.local import choose_open
from luftpause.dataplane.middleware import caller_of, identity_of, json_error
from luftpause.dataplane.reply import summarize_completion
from luftpause.dataplane.slotfiles import prepare_slot
from luftpause.dataplane.sse import SseObserver
from luftpause.dataplane.transport import EngineResponse
from luftpause.dataplane.turn import Turn

if TYPE_CHECKING:
    from luftpause.dataplane.spans import TurnSpan

CLIENT_GONE = "client disconnected"

log = structlog.get_logger("luftpause.dataplane.proxy")


async def chat_completions(
    request: web.Request, traced: TurnSpan | None = None
) -> web.StreamResponse:
    """Proxy one turn; every response carries `x-luftpause-run-id`. With tracing on,
    `spans.traced` passes the turn's span in `traced`."""
    arrived = time.perf_counter()
    dp = request.app[DATAPLANE]
    run_id = request.headers.get(RUN_ID_HEADER, "").strip()
    fresh = False
    try:
        body = await read_body(request, dp.max_body_bytes)
        model, messages, tools, max_tokens = parse_turn_body(body)
        if not run_id:
            run_id = dp.memory.recognise(echoed_tool_call_ids(messages), dp.clock()) or ""
        if not run_id:
            run_id, fresh = uuid4().hex, True
        service_class = parse_service_class(request.headers.get(CLASS_HEADER))
    except DataplaneError as exc:
        return json_error(exc.status, exc.message, run_id=run_id or uuid4().hex)
    # A run this dataplane has not served may be new: its opening says where it may be cached.
    opening = opening_keys(messages, tools) if run_id not in dp.runs.runs else ()
    # A turn a rate-limited engine refuses (429) before anything went to the client goes back
    # to the scheduler as a new turn of the run, as long as waiting fits the deadline.
    deadline = time.monotonic() + dp.rate_limit_wait_s
    for attempt in itertools.count():
        turn = dp.new_turn(
            turn_id=dp.next_turn_id(),
            run_id=run_id,
            model=model,
            service_class=service_class,
            caller=caller_of(request),
            key=identity_of(request).key,
            request_bytes=len(body),
            span=traced,
        )
        if traced is not None and not attempt:
            traced.request(
                model=model,
                run_id=run_id,
                turn_id=turn.turn_id,
                service_class=service_class.name.lower(),
                caller=turn.caller,
            )
        try:
            sent = await _admit_and_proxy(
                request, dp, turn, body, arrived, fresh, opening, (deadline, attempt, max_tokens)
            )
        finally:
            turn.close(CLIENT_GONE)
        if isinstance(sent, web.StreamResponse):
            return sent
        fresh, opening = False, ()
        if sent > 0:
            await asyncio.sleep(sent)
    raise AssertionError("unreachable")


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body; `BodyTooLarge` past `limit`."""
    too_large = BodyTooLarge(f"request body is over the limit of {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None


async def _admit_and_proxy(
    request: web.Request,
    dp: Dataplane,
    turn: Turn,
    body: bytes,
    arrived: float,
    fresh: bool,
    opening: tuple[Key, ...],
    retry: tuple[float, int, int],
) -> web.StreamResponse | float:
    """Place the turn and relay the engine's reply; or, when a rate-limited engine refused it
    and it may be sent again (`retry`: the deadline, the attempt, the request's max_tokens),
    the seconds to wait before it goes back to the scheduler (0: the scheduler holds it)."""
    deadline, attempt, max_tokens = retry
    admit = wire.admit_request(
        turn_id=turn.turn_id,
        run_id=turn.run_id,
        model=turn.model,
        service_class=turn.service_class,
        caller=turn.caller,
        dataplane_id=dp.dataplane_id,
        prompt_bytes=turn.request_bytes,
        opening=opening,
        traceparent="" if turn.span is None else turn.span.traceparent,
        key=turn.key,
        max_tokens=max_tokens,
    )
    runs = dp.runs
    local = None
    waited = 0.0  # for the scheduler and slot calls: not the dataplane's own time
    # A turn with a budget of its own is admitted against it: only the scheduler can hold it.
    # A turn sent again after a 429 goes through the scheduler: it holds it for the window.
    if dp.local_placement and not attempt and (turn.key is None or not turn.key.has_budget):
        local = choose_open(
            dp.link.open_for(turn.model),
            run=runs.runs.get(turn.run_id),
            fresh=fresh,
            load=runs.load,
            opening=opening,
            memory=dp.openings,
            pending=runs.pending,
            request_bytes=turn.request_bytes,
        )
    if local is not None:
        # An open replica has no slots to assign and held nothing.
        placement = wire.Placement(
            replica_id=local.replica_id,
            replica_url=local.url,
            engine_priority=local.engine_priority(turn.service_class),
        )
        dp.link.placed(wire.placed_here(admit, local.replica_id))
        dp.metrics.placed_locally.inc()
    else:
        asked = time.perf_counter()
        try:
            placement = await dp.link.admit(admit)
        except RateLimited as exc:
            turn.rejected()
            retry_after = {"Retry-After": str(max(math.ceil(exc.retry_after_s), 1))}
            return json_error(exc.status, exc.message, run_id=turn.run_id, headers=retry_after)
        except (ModelNotFound, SchedulerError) as exc:
            turn.rejected()
            return json_error(exc.status, exc.message, run_id=turn.run_id)
        waited = time.perf_counter() - asked
        if request.transport is None or request.transport.is_closing():
            turn.placed(placement.replica_id)
            turn.failed(CLIENT_GONE)  # placed as the client left: free the slot, send nothing
            return web.Response(status=499)
    replica_id, slot = placement.replica_id, placement.engine_slot
    turn.placed(replica_id)
    if opening:
        dp.openings.record(replica_id, opening)
    url = placement.replica_url.rstrip("/") + "/v1/chat/completions"
    headers = upstream_headers(request.headers.items(), dp.api_keys.get(replica_id, ""))
    if turn.span is not None:
        turn.span.placed(replica_id, placement.held_ms, locally=local is not None)
        turn.span.outgoing(headers)
    priority = placement.engine_priority
    if priority is not None or slot is not None:  # most engines take the client's body as is
        fields = {"priority": priority, "id_slot": slot}
        body = with_fields(body, {k: v for k, v in fields.items() if v is not None})
    turn.started()
    if slot is not None and (placement.slot_save is not None or placement.slot_restore is not None):
        preparing = time.perf_counter()
        done = await prepare_slot(
            dp.transport,
            dp.metrics,
            dp.slot_order,
            replica_id=replica_id,
            replica_url=placement.replica_url,
            api_key=dp.api_keys.get(replica_id, ""),
            slot=slot,
            save=placement.slot_save,
            restore=placement.slot_restore,
        )
        if placement.slot_restore is not None:
            dp.runs.slot_restored(replica_id, placement.slot_restore)
        if done.get("save") and placement.slot_save and placement.slot_save_run:
            dp.runs.slot_saved(replica_id, placement.slot_save, placement.slot_save_run, dp.clock())
        waited += time.perf_counter() - preparing
    own = time.perf_counter() - arrived - waited
    try:
        engine = await dp.transport.send(url, headers, body)
    except EngineUnreachable as exc:
        log.warning("engine unreachable", replica=replica_id, url=url, error=exc.message)
        turn.failed(f"engine unreachable: {exc.message}")
        return json_error(502, f"engine {replica_id}: {exc.message}", run_id=turn.run_id)
    reading = _read_rate_limits(dp, replica_id, engine)
    turn.read_limits(reading, refused=engine.status == 429)
    try:
        wait = refusal_wait(engine.status, reading, attempt)
        if wait is not None and time.monotonic() + wait <= deadline:
            # The scheduler learns the refusal from the turn's end and holds the next try
            # until the window cools down; without a reading, the dataplane waits it out.
            turn.failed(f"engine status {engine.status}: rate limited, sent again", retried=True)
            dp.metrics.rate_limited(replica_id, wait)
            log.info("rate limited, sending again", replica=replica_id, wait_s=round(wait, 3))
            return 0.0 if reading is not None else wait
        if not 200 <= engine.status < 300:
            return await _relay_refusal(turn, engine)
        if is_event_stream(engine.headers):
            dp.metrics.open_streams += 1
            try:
                return await _relay_stream(request, dp, turn, engine, arrived, own)
            finally:
                dp.metrics.open_streams -= 1
        return await _relay_body(dp, turn, engine, arrived, own)
    finally:
        engine.close()


# An engine that says "retry now" (Retry-After: 0) is not asked again sooner than this.
_MIN_WAIT_S = 0.1


def refusal_wait(status: int, reading: ratelimits.Reading | None, attempt: int) -> float | None:
    """How long to wait before sending again a turn refused with `status`; None unless it was
    refused for its rate limit (429). The engine's Retry-After, else the latest reset of a
    spent budget, else 0.5 s doubling per attempt (at most 8 s)."""
    if status != 429:
        return None
    if reading is not None and reading.retry_after_s is not None:
        return max(reading.retry_after_s, _MIN_WAIT_S)
    if reading is not None:
        spent = [
            b.reset_s
            for b in reading.budgets.values()
            if b.remaining == 0 and b.reset_s is not None
        ]
        if spent:
            return max(*spent, _MIN_WAIT_S)
    return min(0.5 * 2**attempt, 8.0)


def _read_rate_limits(
    dp: Dataplane, replica_id: str, engine: EngineResponse
) -> ratelimits.Reading | None:
    """Keep what a hosted replica's reply says of its rate limits (for /metrics)."""
    now = time.time()
    reading = ratelimits.read(engine.headers, now, dp.limit_headers.get(replica_id))
    if reading is None:
        return None
    if reading.malformed:
        log.warning("unreadable rate-limit headers", replica=replica_id, headers=reading.malformed)
    dp.metrics.rate_limits(replica_id, reading, now)
    return reading


async def _relay_refusal(turn: Turn, engine: EngineResponse) -> web.Response:
    """429, 5xx, 4xx: the engine's status, headers (Retry-After) and body, unchanged."""
    try:
        data = await engine.read()
    except EngineStreamBroken as exc:
        turn.failed(f"engine status {engine.status}, body broke off: {exc.message}")
        return json_error(502, f"engine {turn.replica_id}: {exc.message}", run_id=turn.run_id)
    turn.response_bytes = len(data)
    turn.failed(f"engine status {engine.status}")
    return web.Response(
        status=engine.status,
        body=data,
        headers=downstream_headers(engine.headers.items(), turn.run_id),
    )


async def _relay_body(
    dp: Dataplane, turn: Turn, engine: EngineResponse, arrived: float, own: float
) -> web.Response:
    try:
        data = await engine.read()
        received = time.perf_counter()
    except EngineStreamBroken as exc:
        log.warning("engine reply broke off", replica=turn.replica_id, error=exc.message)
        turn.failed(f"engine reply broke off: {exc.message}")
        return json_error(502, f"engine {turn.replica_id}: {exc.message}", run_id=turn.run_id)
    turn.response_bytes = len(data)
    turn.finished(summarize_completion(data))
    now = time.perf_counter()
    dp.metrics.first_byte(turn.service_class, now - arrived, own + now - received)
    if turn.span is not None:
        turn.span.first_byte(now - arrived)
    return web.Response(
        status=engine.status,
        body=data,
        headers=downstream_headers(engine.headers.items(), turn.run_id),
    )


async def _relay_stream(
    request: web.Request,
    dp: Dataplane,
    turn: Turn,
    engine: EngineResponse,
    arrived: float,
    own: float,
) -> web.StreamResponse:
    """Headers at once, then every engine chunk as it comes, observed after it is sent."""
    resp = web.StreamResponse(
        status=engine.status, headers=downstream_headers(engine.headers.items(), turn.run_id)
    )
    await resp.prepare(request)
    observer = SseObserver()
    sent = 0
    received = 0.0
    try:
        while chunk := await engine.read_chunk():
            if not sent:
                received = time.perf_counter()
            await resp.write(chunk)
            if not sent:
                now = time.perf_counter()
                dp.metrics.first_byte(turn.service_class, now - arrived, own + now - received)
                if turn.span is not None:
                    turn.span.first_byte(now - arrived)
            sent += len(chunk)
            if observer.feed(chunk):
                turn.first_token()
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
    if observer.flush():
        turn.first_token()
    turn.response_bytes = sent
    turn.finished(observer.summary())
    await resp.write_eof()
    return resp
