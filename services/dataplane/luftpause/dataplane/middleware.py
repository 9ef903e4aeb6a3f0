"""The request guards: JSON error bodies, bearer auth, the identity headers' checks.

Shell module. In `build_app` order, outermost first:

- `error_middleware`: every error a client sees is a JSON error in its API's shape
  (`apis.error_document`: `{"error": {"message": ...}}`, Anthropic's for `/v1/messages`), never
  HTML. Handlers return their expected errors themselves (they know the run id); this catches
  the rest: aiohttp's own 404 / 405 / 413, our errors raised past a handler, and anything
  unexpected, which is logged with its stack and answered 500 without it.
- `auth_middleware(token, keys)`: 401 with `WWW-Authenticate: Bearer` unless the request carries
  the token or a key of the keys file, as `Authorization: Bearer` or as `x-api-key` (the header
  Anthropic's SDKs and Claude Code send an API key in), 403 for acting for a key one may not
  (the decision is `common.auth.authenticate`); the request's `Identity` is kept under
  `IDENTITY` (read it with `identity_of`, the turn's caller with `caller_of`). `/health`,
  `/ready` and `/metrics` stay open.
- `identity_middleware`: a run id that is not UTF-8 or too long, or an unknown class, is a 400
  before any handler reads it (aiohttp hands header bytes that are not UTF-8 over as surrogate
  escapes, which protobuf refuses to encode); a turn of a class its key may not use is a 403.
"""

from __future__ import annotations

from uuid import uuid4

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from luftpause.common.auth import (
    ANYONE,
    CHALLENGE,
    ON_BEHALF_OF_HEADER,
    Identity,
    Refused,
    authenticate,
    protected,
)
from luftpause.common.keys import KeysFile
from luftpause.dataplane.apis import Api, api_of, error_body
from luftpause.dataplane.errors import DataplaneError
from luftpause.dataplane.forwarding import CALLER_HEADER, CLASS_HEADER, RUN_ID_HEADER
from luftpause.dataplane.identity import (
    ServiceClass,
    check_run_id,
    narrow_caller,
    parse_service_class,
)

log = structlog.get_logger("luftpause.dataplane")
IDENTITY = web.RequestKey("identity", Identity)
# The turns whose class a key must be allowed: a decision is an interactive turn.
_CLASSED = {
    "/v1/chat/completions": None,
    "/v1/messages": None,
    "/v1/responses": None,
    "/v1/decide": ServiceClass.INTERACTIVE,
}


def json_error(
    status: int,
    message: str,
    *,
    run_id: str = "",
    headers: dict[str, str] | None = None,
    api: Api = Api.CHAT,
) -> web.Response:
    """An error response in `api`'s shape (OpenAI's unless told)."""
    out = dict(headers or {})
    if run_id:
        out[RUN_ID_HEADER] = run_id
    return web.Response(
        status=status,
        body=error_body(api, status, message),
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
    return json_error(exc.status, message, headers=headers, api=api_of(request.path))


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
        return json_error(exc.status, exc.message, api=api_of(request.path))
    except Exception:
        log.exception("unexpected error", method=request.method, path=request.path)
        return json_error(500, "internal error in the dataplane", api=api_of(request.path))


def identity_of(request: web.Request) -> Identity:
    """Who the request is (anyone when auth is off)."""
    return request.get(IDENTITY, ANYONE)


def caller_of(request: web.Request) -> str:
    """The turn's caller: the key's name, narrowed by `x-luftpause-caller`."""
    return narrow_caller(identity_of(request).caller, request.headers.get(CALLER_HEADER))


def auth_middleware(token: bytes | None, keys: KeysFile | None = None) -> Middleware:
    """Require `Authorization: Bearer <token or key>` everywhere but the open paths."""

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not protected(request.path):
            return await handler(request)
        try:
            request[IDENTITY] = authenticate(
                _credential(request),
                request.headers.get(ON_BEHALF_OF_HEADER),
                token=token,
                keys=None if keys is None else keys.current(),
            )
        except Refused as exc:
            log.info("refused request", method=request.method, path=request.path, error=exc.message)
            headers = dict(CHALLENGE) if exc.status == 401 else None
            return json_error(exc.status, exc.message, headers=headers, api=api_of(request.path))
        return await handler(request)

    return check_token


def _credential(request: web.Request) -> str | None:
    """The request's `Authorization`, else its `x-api-key` as a bearer."""
    authorization = request.headers.get("Authorization")
    if authorization:
        return authorization
    key = request.headers.get("x-api-key", "").strip()
    return f"Bearer {key}" if key else None


@web.middleware
async def identity_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """400 for an identity header no handler could use."""
    if not request.path.startswith("/v1/"):
        return await handler(request)
    try:
        run_id = check_run_id(request.headers.get(RUN_ID_HEADER))
        service_class = parse_service_class(request.headers.get(CLASS_HEADER))
    except DataplaneError as exc:
        return json_error(exc.status, exc.message, run_id=uuid4().hex, api=api_of(request.path))
    if request.method == "POST" and request.path in _CLASSED:
        try:
            identity_of(request).check_class((_CLASSED[request.path] or service_class).name.lower())
        except Refused as exc:
            api = api_of(request.path)
            return json_error(exc.status, exc.message, run_id=run_id or uuid4().hex, api=api)
    return await handler(request)
