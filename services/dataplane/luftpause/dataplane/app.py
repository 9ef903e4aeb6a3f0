"""The dataplane's aiohttp application: routes, the error middleware, startup and shutdown.

Shell module. `build_app` wires a `Dataplane` (link, transport, tables, metrics) into an app;
`start_server` runs it the way production does (handler cancellation on client disconnect, no
access log on the hot path), for `main` and for tests alike.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from aiohttp import web

from luftpause.common import tracing
from luftpause.common.keys import KeysFile
from luftpause.dataplane import spans, wire
from luftpause.dataplane.apis import COUNT_TOKENS_PATH, PATHS, Api
from luftpause.dataplane.context import (
    DATAPLANE,
    DEFAULT_MAX_BODY_BYTES,
    MODELS_HOLD_SECONDS,
    RATE_LIMIT_WAIT_S,
    Dataplane,
    Served,
)
from luftpause.dataplane.counting import count_tokens
from luftpause.dataplane.decide import decide
from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.forwarding import RUN_ID_HEADER
from luftpause.dataplane.identity import ToolCallMemory, check_run_id
from luftpause.dataplane.link import RECONNECT_SECONDS, SchedulerLink
from luftpause.dataplane.middleware import (
    auth_middleware,
    error_middleware,
    identity_middleware,
    json_error,
)
from luftpause.dataplane.models import list_models
from luftpause.dataplane.proxy import chat_completions, messages, responses
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.transport import AiohttpTransport, EngineTransport

PRUNE_SECONDS = 60.0


async def end_run(request: web.Request) -> web.Response:
    """`DELETE /v1/runs/{id}`: the agent says the run is over; forget it here and there."""
    dp = request.app[DATAPLANE]
    try:
        run_id = check_run_id(request.match_info["id"])
    except BadRequest as exc:
        return json_error(400, exc.message)
    if not run_id:
        return json_error(400, "the run id must not be empty")
    dp.link.report(wire.run_ended(run_id))
    dp.runs.end_run(run_id)
    dp.memory.forget_run(run_id)
    return web.json_response({"id": run_id, "deleted": True}, headers={RUN_ID_HEADER: run_id})


async def health(request: web.Request) -> web.Response:
    """Liveness: 200 while the process serves."""
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """Readiness: 503 until the first Report stream to the scheduler is up, then 200, saying in its
    body whether the scheduler is reachable now.

    Once it has reached its scheduler, a dataplane holds turns through the scheduler's later
    absences (a restart, a moved pod) and places them when it is back, as the failure table
    promises; reporting not ready then would take it out of its Service, and a held turn
    would become a refused connection.
    """
    link = request.app[DATAPLANE].link
    if link.ready:
        return web.json_response({"status": "ready", "scheduler": "connected"})
    reason = f"scheduler unreachable at {link.target}: {link.down_reason}"
    if link.ever_up:
        return web.json_response({"status": "ready", "scheduler": f"{reason}; turns are held"})
    return json_error(503, reason)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[DATAPLANE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def _prune(dp: Dataplane, period: float) -> None:
    while True:
        await asyncio.sleep(period)
        now = dp.clock()
        dp.memory.prune(now)
        dp.runs.prune(now)


def build_app(
    *,
    scheduler: str,
    dataplane_id: str,
    api_keys: Mapping[str, str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    transport_factory: Callable[[], EngineTransport] = AiohttpTransport,
    reconnect_delay: float = RECONNECT_SECONDS,
    token: bytes | None = None,
    keys: KeysFile | None = None,
    local_placement: bool = True,
    config_models: Sequence[str] | None = None,
    models_hold_seconds: float = MODELS_HOLD_SECONDS,
    rate_limit_wait_s: float = RATE_LIMIT_WAIT_S,
    limit_headers: Mapping[str, Mapping[str, str]] | None = None,
    served: Mapping[str, Served] | None = None,
) -> web.Application:
    """The app; the link and the engine transport open on startup and close on cleanup.

    With `token` or `keys`, every route but `/health`, `/ready` and `/metrics` needs
    `Authorization: Bearer` with the token or one of the keys. Without `local_placement`, every
    turn waits for the scheduler's placement, open replicas or not. `config_models` (the
    endpoint file's) answer `GET /v1/models` while the scheduler cannot be reached; without them
    that request waits `models_hold_seconds` for it. `served` says, per replica id, which APIs
    it serves and where its key goes (the endpoint file's `apis`, `key_header`); a replica not
    in it serves Chat Completions only.
    """
    runs = RunTable()
    auth = [auth_middleware(token, keys)] if token or keys else []
    guards = [error_middleware, *auth, identity_middleware]
    app = web.Application(middlewares=guards, client_max_size=max_body_bytes)
    link = SchedulerLink(
        target=scheduler, dataplane_id=dataplane_id, runs=runs, reconnect_delay=reconnect_delay
    )

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        dp = Dataplane(
            dataplane_id=dataplane_id,
            link=link,
            transport=transport_factory(),
            runs=runs,
            memory=ToolCallMemory(),
            api_keys=dict(api_keys or {}),
            max_body_bytes=max_body_bytes,
            local_placement=local_placement,
            config_models=None if config_models is None else tuple(config_models),
            models_hold_seconds=models_hold_seconds,
            models_retry_seconds=reconnect_delay,
            rate_limit_wait_s=rate_limit_wait_s,
            limit_headers=dict(limit_headers or {}),
            served=dict(served or {}),
        )
        app[DATAPLANE] = dp
        dp.metrics.watch_link(link)
        link.start()
        pruner = asyncio.create_task(_prune(dp, PRUNE_SECONDS), name="prune")
        yield
        pruner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pruner
        await link.close()
        await dp.transport.close()

    app.cleanup_ctx.append(lifecycle)
    # Chosen once: with tracing off the handlers run bare and spans cost nothing.
    doors = {Api.CHAT: chat_completions, Api.MESSAGES: messages, Api.RESPONSES: responses}
    for api, handler in doors.items():
        path = PATHS[api]
        app.router.add_post(path, spans.traced(handler, path) if tracing.enabled() else handler)
    app.router.add_post(COUNT_TOKENS_PATH, count_tokens)
    app.router.add_post("/v1/decide", decide)
    app.router.add_get("/v1/models", list_models)
    app.router.add_delete("/v1/runs/{id}", end_run)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    return app


async def start_server(
    app: web.Application, host: str, port: int, *, reuse_port: bool = False
) -> tuple[web.AppRunner, int]:
    """Serve `app` (with `reuse_port`, on a port other workers share); returns the runner (call
    `cleanup()`) and the bound port."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
    await site.start()
    bound: int = runner.addresses[0][1] if port == 0 else port
    return runner, bound
