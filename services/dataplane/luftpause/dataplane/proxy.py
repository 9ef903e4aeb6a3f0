"""One agent turn through the scheduler to an engine and back, by any of the three doors.

Shell module, kept thin: what a request and its reply become per API and replica lives in
`doors`, the run's identity in `identity`, the open-replica rule in `local`, the headers in
`forwarding`, the bookkeeping in `turn`, and the reply's way back in `relay`. A turn's path,
`serve_turn` then `_attempt`, step by step:

1. read: the body, checked by its door (an `Ask`); the run (the run header, else the tool call
   ids it echoes, else a new one), the class and the caller;
2. place (`_place`): on an open replica by `local`'s rule, reported; else Admit, held until
   placed;
3. address (`_address`): what goes to that replica, the client's request as it is or
   translated to Chat Completions (`doors.Door.upstream`), with the engine's key and fields;
4. send (`_send`): report started, prepare a saved slot, send; 502 if the engine is unreachable;
5. refused for its rate limit (`_again`): back to step 2 after the wait, within the deadline;
6. relay (`relay.relay`): the refusal, the body or the stream, in the client's API.

Every error a client sees is in its API's error shape (`apis`).

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
from dataclasses import dataclass
from typing import TYPE_CHECKING
from uuid import uuid4

import structlog
from aiohttp import web

from luftpause.common import ratelimits
from luftpause.common.prefixes import Key
from luftpause.dataplane import wire
from luftpause.dataplane.apis import TITLES
from luftpause.dataplane.context import DATAPLANE, Dataplane
from luftpause.dataplane.doors import CHAT, MESSAGES, RESPONSES, Ask, Door, Upstream
from luftpause.dataplane.errors import (
    BadRequest,
    BodyTooLarge,
    DataplaneError,
    EngineUnreachable,
    ModelNotFound,
    RateLimited,
    SchedulerError,
)
from luftpause.dataplane.forwarding import (
    CLASS_HEADER,
    RUN_ID_HEADER,
    upstream_headers,
    with_fields,
)
from luftpause.dataplane.identity import parse_service_class
from luftpause.dataplane.local import choose_open
from luftpause.dataplane.middleware import caller_of, identity_of, json_error
from luftpause.dataplane.relay import CLIENT_GONE, relay
from luftpause.dataplane.slotfiles import prepare_slot
from luftpause.dataplane.transport import EngineResponse
from luftpause.dataplane.turn import Turn

if TYPE_CHECKING:
    from luftpause.dataplane.spans import TurnSpan

log = structlog.get_logger("luftpause.dataplane.proxy")


async def chat_completions(
    request: web.Request, traced: TurnSpan | None = None
) -> web.StreamResponse:
    """`POST /v1/chat/completions`."""
    return await serve_turn(request, CHAT, traced)


async def messages(request: web.Request, traced: TurnSpan | None = None) -> web.StreamResponse:
    """`POST /v1/messages` (Anthropic's Messages API)."""
    return await serve_turn(request, MESSAGES, traced)


async def responses(request: web.Request, traced: TurnSpan | None = None) -> web.StreamResponse:
    """`POST /v1/responses` (OpenAI's Responses API)."""
    return await serve_turn(request, RESPONSES, traced)


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One try at a turn: when the request arrived, whether its run is new here (and its
    opening), by when a turn refused for its rate limit may still be sent again, which try."""

    arrived: float
    fresh: bool
    opening: tuple[Key, ...]
    deadline: float
    number: int


@dataclass(frozen=True, slots=True)
class SendAgain:
    """The engine refused the turn for its rate limit: send it again after `wait_s` seconds
    (0: at once, and the scheduler holds it until the window cools down)."""

    wait_s: float


async def serve_turn(
    request: web.Request, door: Door, traced: TurnSpan | None = None
) -> web.StreamResponse:
    """Proxy one turn that came in by `door`; every response carries `x-luftpause-run-id`. With
    tracing on, `spans.traced` passes the turn's span in `traced`."""
    arrived = time.perf_counter()
    dp = request.app[DATAPLANE]
    run_id = request.headers.get(RUN_ID_HEADER, "").strip()
    fresh = False
    try:
        ask = door.read(await read_body(request, dp.max_body_bytes))
        if not run_id:
            run_id = dp.memory.recognise(door.echoed(ask), dp.clock()) or ""
        if not run_id:
            run_id, fresh = uuid4().hex, True
        service_class = parse_service_class(request.headers.get(CLASS_HEADER))
    except DataplaneError as exc:
        return json_error(exc.status, exc.message, run_id=run_id or uuid4().hex, api=door.api)
    # A run this dataplane has not served may be new: its opening says where it may be cached.
    opening = door.opening(ask) if run_id not in dp.runs.runs else ()
    # A turn a rate-limited engine refuses (429) before anything went to the client goes back
    # to the scheduler as a new turn of the run, as long as waiting fits the deadline.
    deadline = time.monotonic() + dp.rate_limit_wait_s
    for number in itertools.count():
        turn = dp.new_turn(
            turn_id=dp.next_turn_id(),
            run_id=run_id,
            model=ask.model,
            service_class=service_class,
            caller=caller_of(request),
            key=identity_of(request).key,
            request_bytes=len(ask.body),
            span=traced,
        )
        if traced is not None and not number:
            traced.request(
                model=ask.model,
                run_id=run_id,
                turn_id=turn.turn_id,
                service_class=service_class.name.lower(),
                caller=turn.caller,
            )
        attempt = Attempt(
            arrived=arrived, fresh=fresh, opening=opening, deadline=deadline, number=number
        )
        try:
            outcome = await _attempt(request, dp, door, ask, turn, attempt)
        finally:
            turn.close(CLIENT_GONE)
        if isinstance(outcome, web.StreamResponse):
            return outcome
        fresh, opening = False, ()
        if outcome.wait_s > 0:
            await asyncio.sleep(outcome.wait_s)
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


async def _attempt(
    request: web.Request, dp: Dataplane, door: Door, ask: Ask, turn: Turn, attempt: Attempt
) -> web.StreamResponse | SendAgain:
    """Place the turn, address it, send it and relay the reply; or say when to try again."""
    placed = await _place(request, dp, turn, ask, attempt)
    if isinstance(placed, web.StreamResponse):
        return placed
    placement, waited = placed
    addressed = _address(request, dp, door, ask, turn, placement)
    if isinstance(addressed, web.StreamResponse):
        return addressed
    upstream, url, headers, body = addressed
    sent = await _send(dp, door, turn, placement, url, headers, body)
    if isinstance(sent, web.StreamResponse):
        return sent
    engine, slot_wait, sent_at = sent
    own = sent_at - attempt.arrived - waited - slot_wait
    try:
        again = _again(dp, turn, engine, attempt)
        if again is not None:
            return again
        return await relay(request, dp, turn, engine, upstream, door.api, (attempt.arrived, own))
    finally:
        engine.close()


async def _place(
    request: web.Request, dp: Dataplane, turn: Turn, ask: Ask, attempt: Attempt
) -> tuple[wire.Placement, float] | web.StreamResponse:
    """Where the turn goes, and how long the scheduler took to say (0 when placed here); or
    the client's answer when it may go nowhere."""
    admit = wire.admit_request(
        turn_id=turn.turn_id,
        run_id=turn.run_id,
        model=turn.model,
        service_class=turn.service_class,
        caller=turn.caller,
        dataplane_id=dp.dataplane_id,
        prompt_bytes=turn.request_bytes,
        opening=attempt.opening,
        traceparent="" if turn.span is None else turn.span.traceparent,
        key=turn.key,
        max_tokens=ask.max_tokens,
    )
    local = None
    # A turn with a budget of its own is admitted against it: only the scheduler can hold it.
    # A turn sent again after a 429 goes through the scheduler: it holds it for the window.
    if dp.local_placement and not attempt.number and (turn.key is None or not turn.key.has_budget):
        local = choose_open(
            dp.link.open_for(turn.model),
            run=dp.runs.runs.get(turn.run_id),
            fresh=attempt.fresh,
            load=dp.runs.load,
            opening=attempt.opening,
            memory=dp.openings,
            pending=dp.runs.pending,
            request_bytes=turn.request_bytes,
        )
    waited = 0.0
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
            return json_error(
                exc.status, exc.message, run_id=turn.run_id, headers=retry_after, api=ask.api
            )
        except (ModelNotFound, SchedulerError) as exc:
            turn.rejected()
            return json_error(exc.status, exc.message, run_id=turn.run_id, api=ask.api)
        waited = time.perf_counter() - asked
        if request.transport is None or request.transport.is_closing():
            turn.placed(placement.replica_id)
            turn.failed(CLIENT_GONE)  # placed as the client left: free the slot, send nothing
            return web.Response(status=499)
    turn.placed(placement.replica_id)
    if attempt.opening:
        dp.openings.record(placement.replica_id, attempt.opening)
    if turn.span is not None:
        turn.span.placed(placement.replica_id, placement.held_ms, locally=local is not None)
    return placement, waited


def _address(
    request: web.Request,
    dp: Dataplane,
    door: Door,
    ask: Ask,
    turn: Turn,
    placement: wire.Placement,
) -> tuple[Upstream, str, dict[str, str], bytes] | web.Response:
    """What goes to the placed replica: the request as it is (its query string too) or
    translated, its URL, the headers with the engine's key, and the body with the fields the
    placement sets; or the client's error when the replica cannot take it."""
    replica_id = placement.replica_id
    served = dp.served_by(replica_id)
    try:
        upstream = door.upstream(ask, served.apis)
    except BadRequest as exc:
        turn.failed(f"request cannot be translated: {exc.message}")
        return json_error(exc.status, exc.message, run_id=turn.run_id, api=ask.api)
    if upstream is None:
        turn.failed(f"replica serves neither {TITLES[ask.api]} nor Chat Completions")
        message = (
            f"engine {replica_id} serves neither {TITLES[ask.api]} nor Chat Completions "
            "(the endpoint file's `apis`)"
        )
        return json_error(502, message, run_id=turn.run_id, api=ask.api)
    dp.metrics.door(ask.api, upstream.translated)
    key = dp.api_keys.get(replica_id, "")
    headers = upstream_headers(request.headers.items(), key, served.key_header)
    if turn.span is not None:
        turn.span.upstream(upstream.api.value, translated=upstream.translated)
        turn.span.outgoing(headers)
    body = upstream.body
    priority, slot = placement.engine_priority, placement.engine_slot
    if priority is not None or slot is not None:  # most engines take the client's body as is
        fields = {"priority": priority, "id_slot": slot}
        body = with_fields(body, {k: v for k, v in fields.items() if v is not None})
    url = placement.replica_url.rstrip("/") + upstream.path
    if request.query_string and not upstream.translated:
        url += "?" + request.query_string  # Claude Code's `?beta=true`
    return upstream, url, headers, body


async def _send(
    dp: Dataplane,
    door: Door,
    turn: Turn,
    placement: wire.Placement,
    url: str,
    headers: dict[str, str],
    body: bytes,
) -> tuple[EngineResponse, float, float] | web.Response:
    """Report started, move a saved slot context if the placement says so, and send; the
    engine's response, the seconds the slot calls took and when the request went (perf_counter),
    or the client's 502 when the engine cannot be reached."""
    replica_id, slot = placement.replica_id, placement.engine_slot
    turn.started()
    slot_wait = 0.0
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
        slot_wait = time.perf_counter() - preparing
    sent_at = time.perf_counter()
    try:
        engine = await dp.transport.send(url, headers, body)
    except EngineUnreachable as exc:
        log.warning("engine unreachable", replica=replica_id, url=url, error=exc.message)
        turn.failed(f"engine unreachable: {exc.message}")
        message = f"engine {replica_id}: {exc.message}"
        return json_error(502, message, run_id=turn.run_id, api=door.api)
    return engine, slot_wait, sent_at


def _again(dp: Dataplane, turn: Turn, engine: EngineResponse, attempt: Attempt) -> SendAgain | None:
    """Keep the reply's rate-limit reading; if the engine refused the turn for its rate limit
    and waiting fits the deadline, end this try and say when to send it again."""
    reading = _read_rate_limits(dp, turn.replica_id, engine)
    turn.read_limits(reading, refused=engine.status == 429)
    wait = refusal_wait(engine.status, reading, attempt.number)
    if wait is None or time.monotonic() + wait > attempt.deadline:
        return None
    # The scheduler learns the refusal from the turn's end and holds the next try until the
    # window cools down; without a reading, the dataplane waits it out.
    turn.failed(f"engine status {engine.status}: rate limited, sent again", retried=True)
    dp.metrics.rate_limited(turn.replica_id, wait)
    log.info("rate limited, sending again", replica=turn.replica_id, wait_s=round(wait, 3))
    return SendAgain(0.0 if reading is not None else wait)


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
