"""Bearer auth for the runtime's HTTP surface (`/mcp`, `/status`), as an ASGI wrapper.

Shell module (an ASGI middleware; the decision is `common.auth.bearer_ok`). With a token, every
HTTP request but `/health`, `/ready` and `/metrics` needs `Authorization: Bearer <token>` and
otherwise gets 401 with a JSON error and `WWW-Authenticate: Bearer`; without one, everything
passes (the runtime's `main` logs a warning). The same token is what the runtime sends to the
dataplane. CORS for `/status` (its preflight included) is `cors`'s, outside this wrapper.
"""

from __future__ import annotations

import json
from typing import Any

from luftpause.common.auth import CHALLENGE, bearer_ok

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})

Scope = dict[str, Any]
Receive = Any
Send = Any
App = Any


class BearerAuth:
    """Wraps an ASGI app; lets through only requests carrying the token."""

    def __init__(self, app: App, token: bytes | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = next(
            (
                v.decode("utf-8", "surrogateescape")
                for k, v in scope.get("headers", ())
                if k == b"authorization"
            ),
            None,
        )
        if bearer_ok(header, self.token):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": {"message": "missing or wrong bearer token"}}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in CHALLENGE.items()),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
