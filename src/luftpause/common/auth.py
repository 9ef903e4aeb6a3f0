"""Bearer auth shared by the dataplane and the runtime: `LUFTPAUSE_TOKEN` turns it on.

Pure module: no I/O. Each service's middleware asks `protected` and `bearer_ok`; its `main`
reads the token with `token_from_env` and warns when it is unset. Everything but the open
paths is protected (not just `/v1/...` or `/mcp`), so a path the router does not know, or one
spelled another way, can never slip past: it answers 401 before it could answer 404.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

TOKEN_ENV = "LUFTPAUSE_TOKEN"
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
CHALLENGE = {"WWW-Authenticate": "Bearer"}


def token_from_env(environ: Mapping[str, str]) -> bytes | None:
    """The configured token as bytes; None (auth off) when unset or blank."""
    raw = environ.get(TOKEN_ENV, "").strip()
    return raw.encode() if raw else None


def protected(path: str) -> bool:
    """True if a request for `path` must carry the token."""
    return path not in OPEN_PATHS


def bearer_ok(header: str | None, token: bytes) -> bool:
    """True if `header` is `Bearer <token>`; the token is compared in constant time."""
    if not header:
        return False
    scheme, _, presented = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Header bytes that are not UTF-8 arrive as surrogate escapes: give them back as bytes.
    return hmac.compare_digest(presented.strip().encode("utf-8", "surrogateescape"), token)
