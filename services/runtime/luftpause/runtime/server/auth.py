"""Bearer auth for the runtime's HTTP surface (`/mcp`, `/status`), as an ASGI wrapper.

Shell module (an ASGI middleware; the decision is `common.auth.authenticate`). With a token or a
keys file, every HTTP request but `/health`, `/ready` and `/metrics` needs `Authorization:
Bearer <token or key>` and otherwise gets 401 with a JSON error and `WWW-Authenticate: Bearer`
(403 for an on-behalf-of header it may not send); without either, everything passes (the
runtime's `main` logs a warning). The request's `Identity` rides in its ASGI scope under
`SCOPE_KEY`, where the MCP tools read it (`identity_of`): a run remembers the key that spawned
it. CORS for `/status` (its preflight included) is `cors`'s, outside this wrapper.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

from luftpause.common.auth import (
    ANYONE,
    CHALLENGE,
    ON_BEHALF_OF_HEADER,
    Identity,
    Refused,
    authenticate,
)
from luftpause.common.keys import KeysFile

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
SCOPE_KEY = "luftpause.identity"

Scope = MutableMapping[str, Any]
Receive = Any
Send = Any
App = Any


def identity_of(request: Any) -> Identity:
    """The identity auth gave a request (a starlette `Request`, or anything with a `scope`)."""
    scope = getattr(request, "scope", None)
    found = scope.get(SCOPE_KEY) if isinstance(scope, dict) else None
    return found if isinstance(found, Identity) else ANYONE


def _header(scope: Scope, name: bytes) -> str | None:
    return next(
        (v.decode("utf-8", "surrogateescape") for k, v in scope.get("headers", ()) if k == name),
        None,
    )


class BearerAuth:
    """Wraps an ASGI app; lets through only requests carrying the token or a key."""

    def __init__(self, app: App, token: bytes | None, keys: KeysFile | None = None) -> None:
        self.app = app
        self.token = token
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        off = self.token is None and self.keys is None
        if off or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        try:
            identity = authenticate(
                _header(scope, b"authorization"),
                _header(scope, ON_BEHALF_OF_HEADER.encode()),
                token=self.token,
                keys=None if self.keys is None else self.keys.current(),
            )
        except Refused as exc:
            await _refuse(send, exc)
            return
        await self.app({**scope, SCOPE_KEY: identity}, receive, send)


async def _refuse(send: Send, exc: Refused) -> None:
    body = json.dumps({"error": {"message": exc.message}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if exc.status == 401:
        headers += [(k.lower().encode(), v.encode()) for k, v in CHALLENGE.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
