"""HTTP/1 surface of the scheduler on :5001: `/status` (JSON), `/` (a page polling it), `/metrics`,
`/health` (liveness: 200 while the process serves) and `/ready` (readiness: 200 once the first
round of engine probes is applied, 503 before).

Shell layer: reads the host's state through the pure `status_view`; changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

from aiohttp import web

from luftpause.scheduler.core.status import status_view
from luftpause.scheduler.host import SchedulerHost

HOST_KEY = web.AppKey("host", SchedulerHost)
READY_KEY: web.AppKey[Callable[[], bool]] = web.AppKey("ready")
NOT_READY = "not ready: the first round of engine probes has not finished"


async def _status(request: web.Request) -> web.Response:
    host = request.app[HOST_KEY]
    return web.json_response(status_view(host.state, host.now()))


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[HOST_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def _page(request: web.Request) -> web.Response:
    html = resources.files("luftpause.scheduler").joinpath("static/status.html").read_text()
    return web.Response(text=html, content_type="text/html")


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.Response:
    if request.app[READY_KEY]():
        return web.json_response({"status": "ready"})
    return web.json_response({"error": {"message": NOT_READY}}, status=503)


def build_app(host: SchedulerHost, ready: Callable[[], bool] = lambda: True) -> web.Application:
    """The app; `ready` says whether the scheduler has probed its engines yet."""
    app = web.Application()
    app[HOST_KEY] = host
    app[READY_KEY] = ready
    app.router.add_get("/status", _status)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/", _page)
    return app
