"""`POST /v1/messages/count_tokens`: how many input tokens a Messages API request would take.

Shell module. Not a turn: nothing is admitted or reported. The count is the engine's when a
replica serving the model serves the Messages API itself (the endpoint file's `apis`; one the
scheduler says is open first, else the first in the file): the client's request goes there
unchanged and its answer comes back unchanged. Otherwise no engine can count it in Anthropic's
terms, and the dataplane estimates: 4 characters a token over the request's system prompt,
messages and tools as JSON, answered with `x-luftpause-token-count: estimate`.
"""

from __future__ import annotations

import json
import math

from aiohttp import web

from luftpause.dataplane.apis import COUNT_TOKENS_PATH, Api
from luftpause.dataplane.context import DATAPLANE, Dataplane, Served
from luftpause.dataplane.errors import DataplaneError, EngineStreamBroken, EngineUnreachable
from luftpause.dataplane.forwarding import downstream_headers, upstream_headers
from luftpause.dataplane.messages.request import MessagesRequest, read_request
from luftpause.dataplane.middleware import json_error
from luftpause.dataplane.proxy import read_body

CHARS_PER_TOKEN = 4
ESTIMATE_HEADER = "x-luftpause-token-count"


def estimate(request: MessagesRequest) -> int:
    """Input tokens at `CHARS_PER_TOKEN` characters a token."""
    doc = request.doc
    text = json.dumps([doc.get("system"), doc["messages"], doc.get("tools")], ensure_ascii=False)
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def counting_replica(dp: Dataplane, model: str) -> tuple[str, Served] | None:
    """A replica serving `model` that serves the Messages API itself, an open one first."""
    native = [
        (replica_id, served)
        for replica_id, served in dp.served.items()
        if Api.MESSAGES in served.apis and model in served.models and served.url
    ]
    open_ids = {r.replica_id for r in dp.link.open_for(model)}
    native.sort(key=lambda pair: pair[0] not in open_ids)  # stable: the file's order otherwise
    return native[0] if native else None


async def count_tokens(request: web.Request) -> web.StreamResponse:
    """The engine's count, or an estimate (see the module docstring)."""
    dp = request.app[DATAPLANE]
    try:
        body = await read_body(request, dp.max_body_bytes)
        counted = read_request(body, counting=True)
    except DataplaneError as exc:
        return json_error(exc.status, exc.message, api=Api.MESSAGES)
    target = counting_replica(dp, counted.model)
    if target is None:
        return web.json_response(
            {"input_tokens": estimate(counted)}, headers={ESTIMATE_HEADER: "estimate"}
        )
    replica_id, served = target
    headers = upstream_headers(
        request.headers.items(), dp.api_keys.get(replica_id, ""), served.key_header
    )
    try:
        engine = await dp.transport.send(served.url.rstrip("/") + COUNT_TOKENS_PATH, headers, body)
    except EngineUnreachable as exc:
        return json_error(502, f"engine {replica_id}: {exc.message}", api=Api.MESSAGES)
    try:
        data = await engine.read()
    except EngineStreamBroken as exc:
        return json_error(502, f"engine {replica_id}: {exc.message}", api=Api.MESSAGES)
    finally:
        engine.close()
    reply = downstream_headers(engine.headers.items(), "")
    return web.Response(
        status=engine.status, body=data, headers=[*reply, (ESTIMATE_HEADER, "engine")]
    )
