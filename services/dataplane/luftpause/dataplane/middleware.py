"""Error bodies: every error a client sees is `{"error": {"message": ...}}`, never HTML.

Shell module. Handlers return their expected errors themselves (they know the run id); the
middleware catches the rest: aiohttp's own 404 / 405 / 413, our errors raised past a handler,
and anything unexpected, which is logged with its stack and answered 500 without it.
"""

from __future__ import annotations

import json

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from luftpause.dataplane.errors import DataplaneError
from luftpause.dataplane.forwarding import RUN_ID_HEADER

log = structlog.get_logger("luftpause.dataplane")


def json_error(
    status: int,
    message: str,
    *,
    run_id: str = "",
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An OpenAI-shaped error response."""
    out = dict(headers or {})
    if run_id:
        out[RUN_ID_HEADER] = run_id
    return web.Response(
        status=status,
        body=json.dumps({"error": {"message": message}}).encode(),
        content_type="application/json",
        headers=out,
    )


def _http_error(exc: web.HTTPException, request: web.Request) -> web.Response:
    headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
    if exc.status == 404:
        message = f"no route for {request.path}"
    elif exc.status == 405:
        message = f"method {request.method} not allowed for {request.path}"
    else:
        message = exc.reason
    return json_error(exc.status, message, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn anything a handler raises into a JSON error."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(exc, request)
    except DataplaneError as exc:
        return json_error(exc.status, exc.message)
    except Exception:
        log.exception("unexpected error", method=request.method, path=request.path)
        return json_error(500, "internal error in the dataplane")
