"""CORS for the runtime's `GET /status`, so a page served elsewhere (the scheduler's status page,
on its own port) can read the run tree; as an ASGI wrapper outside the bearer auth.

Shell module. Only `/status` takes part; every other path passes through untouched. A request
whose `Origin` is allowed gets `Access-Control-Allow-Origin` on its answer (a 401 from the auth
too, so the page can say a token is needed rather than see a network error); a preflight
(`OPTIONS /status`) is answered here with 204, before the auth, since a browser sends no
credentials with it. `*` among the origins allows any origin. The default allows the
scheduler's page at its default address only, so that any page open in a user's browser
cannot read the runs' tasks from a runtime that runs without a token.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

CORS_PATHS = frozenset({"/status"})
DEFAULT_ORIGINS = ("http://127.0.0.1:5001", "http://localhost:5001")
ANY = "*"
_PREFLIGHT_MAX_AGE = b"600"

Scope = MutableMapping[str, Any]
Receive = Any
Send = Any
App = Any


class StatusCors:
    """Wraps an ASGI app; answers CORS for `/status` from the allowed origins."""

    def __init__(self, app: App, origins: Iterable[str] = DEFAULT_ORIGINS) -> None:
        self.app = app
        self.origins = frozenset(o.rstrip("/") for o in origins)

    def allowed(self, origin: str | None) -> bytes | None:
        """The Access-Control-Allow-Origin value for a request from `origin`, None for none."""
        if ANY in self.origins:
            return b"*"
        if origin is not None and origin in self.origins:
            return origin.encode()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in CORS_PATHS:
            await self.app(scope, receive, send)
            return
        origin = next(
            (v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"origin"), None
        )
        allow = self.allowed(origin)
        cors = [] if allow is None else [(b"access-control-allow-origin", allow)]
        if allow is not None and allow != b"*":
            cors.append((b"vary", b"Origin"))
        if scope["method"] == "OPTIONS":
            if allow is not None:
                cors += [
                    (b"access-control-allow-methods", b"GET, OPTIONS"),
                    (b"access-control-allow-headers", b"authorization"),
                    (b"access-control-max-age", _PREFLIGHT_MAX_AGE),
                ]
            headers = [(b"allow", b"GET, OPTIONS"), (b"content-length", b"0"), *cors]
            await send({"type": "http.response.start", "status": 204, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_cors(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and cors:
                message = {**message, "headers": [*message.get("headers", ()), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)
