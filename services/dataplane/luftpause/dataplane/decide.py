"""`POST /v1/decide`: a single-pass decision, or labels scored by a generative replica.

Shell module; the forms, the prompt and the scoring live in `labels`. Two paths:

- classify (no `labels`): Admit with `single_pass` and an empty run id, so the scheduler places
  the turn on a single-pass replica outside run state; POST the client's bytes unchanged to
  `<replica>/classify`; answer with the engine's status, headers and body unchanged.
- labels: one normal interactive turn of the run (header, else a new one) on a generative
  replica: a `max_tokens: 1` chat completion with the first token's `top_logprobs`, answered
  with `{"label", "probabilities", "unscored", "model"}`.

Both report started and finished / failed like a chat turn, and map engine failures the same
way: 502 `engine <replica>: <error>` when it cannot be reached, its own status, headers and body
when it refuses. Every response carries `x-luftpause-run-id` (the header's, else a fresh one).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from uuid import uuid4

import structlog
from aiohttp import web

from luftpause.dataplane import wire
from luftpause.dataplane.context import DATAPLANE, Dataplane
from luftpause.dataplane.errors import (
    DataplaneError,
    EngineStreamBroken,
    EngineUnreachable,
    ModelNotFound,
    SchedulerError,
)
from luftpause.dataplane.forwarding import (
    RUN_ID_HEADER,
    downstream_headers,
    upstream_headers,
)
from luftpause.dataplane.identity import ServiceClass, check_run_id
from luftpause.dataplane.labels import (
    ClassifyRequest,
    LabelsRequest,
    first_token_alternatives,
    labels_chat_body,
    parse_decide_body,
    score_labels,
)
from luftpause.dataplane.middleware import caller_of, identity_of, json_error
from luftpause.dataplane.proxy import read_body
from luftpause.dataplane.reply import summarize_completion
from luftpause.dataplane.turn import Turn

CLIENT_GONE = "client disconnected"

log = structlog.get_logger("luftpause.dataplane.decide")


class _Reply:
    """An engine's whole reply."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


async def decide(request: web.Request) -> web.StreamResponse:
    """One decision; the body says which form."""
    arrived = time.perf_counter()
    dp = request.app[DATAPLANE]
    run_id = check_run_id(request.headers.get(RUN_ID_HEADER)) or uuid4().hex
    try:
        body = await read_body(request, dp.max_body_bytes)
        ask = parse_decide_body(body)
    except DataplaneError as exc:
        return json_error(exc.status, exc.message, run_id=run_id)
    caller = caller_of(request)
    if isinstance(ask, ClassifyRequest):
        return await _classify(request, dp, ask, body, run_id, caller, arrived)
    return await _labels(request, dp, ask, run_id, caller, arrived)


async def _classify(
    request: web.Request,
    dp: Dataplane,
    ask: ClassifyRequest,
    body: bytes,
    run_id: str,
    caller: str,
    arrived: float,
) -> web.StreamResponse:
    turn = dp.new_turn(
        turn_id=dp.next_turn_id(),
        run_id="",
        model=ask.model,
        service_class=ServiceClass.INTERACTIVE,
        caller=caller,
        request_bytes=len(body),
        single_pass=True,
        key=identity_of(request).key,
    )
    try:
        reply = await _exchange(request, dp, turn, "/classify", body, run_id)
        if isinstance(reply, web.StreamResponse):
            return reply
        if reply.ok:
            dp.metrics.first_byte(turn.service_class, time.perf_counter() - arrived)
        return web.Response(
            status=reply.status,
            body=reply.body,
            headers=downstream_headers(reply.headers.items(), run_id),
        )
    finally:
        turn.close(CLIENT_GONE)


async def _labels(
    request: web.Request,
    dp: Dataplane,
    ask: LabelsRequest,
    run_id: str,
    caller: str,
    arrived: float,
) -> web.StreamResponse:
    body = labels_chat_body(ask)
    turn = dp.new_turn(
        turn_id=dp.next_turn_id(),
        run_id=run_id,
        model=ask.model,
        service_class=ServiceClass.INTERACTIVE,
        caller=caller,
        request_bytes=len(body),
        key=identity_of(request).key,
    )
    try:
        reply = await _exchange(request, dp, turn, "/v1/chat/completions", body, run_id)
        if isinstance(reply, web.StreamResponse):
            return reply
        if not reply.ok:
            return web.Response(
                status=reply.status,
                body=reply.body,
                headers=downstream_headers(reply.headers.items(), run_id),
            )
        try:
            alternatives = first_token_alternatives(json.loads(reply.body))
        except (ValueError, RecursionError):
            alternatives = None
        if alternatives is None:
            message = f"engine {turn.replica_id}: the reply carries no first-token logprobs"
            return json_error(502, message, run_id=run_id)
        dp.metrics.first_byte(turn.service_class, time.perf_counter() - arrived)
        scores = score_labels(ask.labels, alternatives)
        return web.json_response(scores.as_json(ask.model), headers={RUN_ID_HEADER: run_id})
    finally:
        turn.close(CLIENT_GONE)


async def _exchange(
    request: web.Request,
    dp: Dataplane,
    turn: Turn,
    path: str,
    body: bytes,
    run_id: str,
) -> _Reply | web.StreamResponse:
    """Admit, send `body` to the replica's `path`, read the whole reply; the turn ends here
    (finished on a 2xx, failed otherwise) unless the client leaves. A response is an error
    for the client as it is."""
    admit = wire.admit_request(
        turn_id=turn.turn_id,
        run_id=turn.run_id,
        model=turn.model,
        service_class=turn.service_class,
        caller=turn.caller,
        dataplane_id=dp.dataplane_id,
        single_pass=turn.single_pass,
        key=turn.key,
    )
    try:
        placement = await dp.link.admit(admit)
    except (ModelNotFound, SchedulerError) as exc:
        turn.rejected()
        return json_error(exc.status, exc.message, run_id=run_id)
    turn.placed(placement.replica_id)
    if request.transport is None or request.transport.is_closing():
        turn.failed(CLIENT_GONE)
        return web.Response(status=499)
    url = placement.replica_url.rstrip("/") + path
    headers = upstream_headers(request.headers.items(), dp.api_keys.get(turn.replica_id, ""))
    headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    headers["Content-Type"] = "application/json"
    turn.started()
    try:
        engine = await dp.transport.send(url, headers, body)
    except EngineUnreachable as exc:
        log.warning("engine unreachable", replica=turn.replica_id, url=url, error=exc.message)
        turn.failed(f"engine unreachable: {exc.message}")
        return json_error(502, f"engine {turn.replica_id}: {exc.message}", run_id=run_id)
    try:
        data = await engine.read()
    except EngineStreamBroken as exc:
        log.warning("engine reply broke off", replica=turn.replica_id, error=exc.message)
        turn.failed(f"engine reply broke off: {exc.message}")
        return json_error(502, f"engine {turn.replica_id}: {exc.message}", run_id=run_id)
    finally:
        engine.close()
    turn.response_bytes = len(data)
    reply = _Reply(engine.status, engine.headers, data)
    if reply.ok:
        turn.finished(summarize_completion(data))
    else:
        turn.failed(f"engine status {engine.status}")
    return reply
