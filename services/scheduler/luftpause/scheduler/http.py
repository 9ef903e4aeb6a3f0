"""HTTP/1 surface of the scheduler on :5001: `/status` (JSON), `/` (a page polling it), `/metrics`,
`/health` (liveness: 200 while the process serves) and `/ready` (readiness: 200 once the first
round of engine probes is applied, 503 before).

Shell layer: reads the host's state through the pure `status_view`; changes nothing. The page
also shows the run tree of a runtime (its `/status`, fetched by the browser: the runtime answers
CORS) when the scheduler was given `--runtime-url` or the page `?runtime=URL`.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from importlib import resources

from aiohttp import web

from luftpause.scheduler.core.status import status_view
from luftpause.scheduler.host import SchedulerHost

HOST_KEY = web.AppKey("host", SchedulerHost)
READY_KEY: web.AppKey[Callable[[], bool]] = web.AppKey("ready")
RUNTIME_KEY = web.AppKey("runtime_url", str)
# The page's slot for the runtime's URL; the page reads it when it has no ?runtime=.
RUNTIME_META = '<meta name="luftpause-runtime" content="">'
NOT_READY = "not ready: the first round of engine probes has not finished"


async def _status(request: web.Request) -> web.Response:
    host = request.app[HOST_KEY]
    return web.json_response(status_view(host.state, host.now()))


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[HOST_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def _page(request: web.Request) -> web.Response:
    html = resources.files("luftpause.scheduler").joinpath("static/status.html").read_text()
    runtime = escape(request.app[RUNTIME_KEY], quote=True)
    html = html.replace(RUNTIME_META, RUNTIME_META.replace('content=""', f'content="{runtime}"'))
    return web.Response(text=html, content_type="text/html")


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.Response:
    if request.app[READY_KEY]():
        return web.json_response({"status": "ready"})
    return web.json_response({"error": {"message": NOT_READY}}, status=503)


def build_app(
    host: SchedulerHost, ready: Callable[[], bool] = lambda: True, runtime_url: str = ""
) -> web.Application:
    """The app; `ready` says whether the scheduler has probed its engines yet, `runtime_url`
    whose run tree the page shows (none when empty)."""
    app = web.Application()
    app[HOST_KEY] = host
    app[READY_KEY] = ready
    app[RUNTIME_KEY] = runtime_url
    app.router.add_get("/status", _status)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/", _page)
    return app
