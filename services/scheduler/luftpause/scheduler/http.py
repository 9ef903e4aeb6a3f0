"""HTTP/1 surface of the scheduler on :5001: `/status` (JSON), `/` (a page polling it), `/metrics`.

Shell layer: reads the host's state through the pure `status_view`; changes nothing.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from luftpause.scheduler.core.status import status_view
from luftpause.scheduler.host import SchedulerHost

HOST_KEY = web.AppKey("host", SchedulerHost)


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


def build_app(host: SchedulerHost) -> web.Application:
    app = web.Application()
    app[HOST_KEY] = host
    app.router.add_get("/status", _status)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health)
    app.router.add_get("/", _page)
    return app
