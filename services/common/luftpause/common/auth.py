"""Bearer auth shared by the dataplane and the runtime: `LUFTPAUSE_TOKEN`, a keys file, or both.

Pure module: no I/O. Each service's middleware asks `protected` and `authenticate`; its `main`
reads the token with `token_from_env` (and loads a keys file, `common.keys`) and warns when
neither is set. Everything but the open paths is protected (not just `/v1/...` or `/mcp`), so a
path the router does not know, or one spelled another way, can never slip past: it answers 401
before it could answer 404.

Who a request is (`Identity`): a key of the keys file, whose name is the caller and whose
classes and budget apply; or the operator (the token, or auth off), who may name any caller.
A service key (`acts_for: true`, the runtime) or the operator may send
`x-luftpause-on-behalf-of: <key name>` and is then that key. Refusals (`Refused`): 401 for a
missing or unknown bearer, 403 for acting for a key one may not, or a class the key may not use.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from luftpause.common.keys import KeyEntry, Keys

TOKEN_ENV = "LUFTPAUSE_TOKEN"
# The runtime's own (service) key, the bearer of its turns to the dataplane.
RUNTIME_KEY_ENV = "LUFTPAUSE_RUNTIME_KEY"
ON_BEHALF_OF_HEADER = "x-luftpause-on-behalf-of"
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
CHALLENGE = {"WWW-Authenticate": "Bearer"}
UNAUTHORIZED = "missing or invalid bearer token (Authorization: Bearer <token>)"


def token_from_env(environ: Mapping[str, str], name: str = TOKEN_ENV) -> bytes | None:
    """The configured token as bytes; None (auth off) when unset or blank."""
    raw = environ.get(name, "").strip()
    return raw.encode() if raw else None


def protected(path: str) -> bool:
    """True if a request for `path` must carry the token."""
    return path not in OPEN_PATHS


def presented_bearer(header: str | None) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header, None for any other header."""
    if not header:
        return None
    scheme, _, presented = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return None
    # Header bytes that are not UTF-8 arrive as surrogate escapes: give them back as bytes.
    return presented.strip().encode("utf-8", "surrogateescape")


def bearer_ok(header: str | None, token: bytes) -> bool:
    """True if `header` is `Bearer <token>`; the token is compared in constant time."""
    presented = presented_bearer(header)
    return presented is not None and hmac.compare_digest(presented, token)


class Refused(Exception):
    """A request auth turns away: 401 (who are you?) or 403 (not that)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    """Who a request is: a key of the keys file, or (None) the operator or anyone, auth off."""

    key: KeyEntry | None = None
    # The service key acting for `key` (x-luftpause-on-behalf-of), if one is.
    via: str = ""

    @property
    def caller(self) -> str:
        """The caller the key is ("" for the operator: the caller header names it)."""
        return "" if self.key is None else self.key.name

    def check_class(self, service_class: str) -> None:
        """`Refused` (403) if the key may not use the class."""
        if self.key is not None and not self.key.may_use(service_class):
            raise Refused(403, f"key {self.key.name!r} may not use class {service_class!r}")


ANYONE = Identity()


def authenticate(
    header: str | None,
    on_behalf_of: str | None,
    *,
    token: bytes | None,
    keys: Keys | None,
) -> Identity:
    """The identity of a request's `Authorization` (and on-behalf-of) header; `Refused` if none.

    Without keys the on-behalf-of header is ignored, as before keys existed.
    """
    presented = presented_bearer(header)
    if presented is None:
        raise Refused(401, UNAUTHORIZED)
    if token is not None and hmac.compare_digest(presented, token):
        return ANYONE if keys is None else _acting(keys, None, on_behalf_of)
    entry = None if keys is None else keys.find(presented)
    if keys is None or entry is None:
        raise Refused(401, UNAUTHORIZED)
    return _acting(keys, entry, on_behalf_of)


def _acting(keys: Keys, entry: KeyEntry | None, on_behalf_of: str | None) -> Identity:
    """`entry` (None: the operator), or the key it acts for."""
    name = (on_behalf_of or "").strip()
    if not name or (entry is not None and name == entry.name):
        return Identity(key=entry)
    if entry is not None and not entry.acts_for:
        raise Refused(403, f"key {entry.name!r} may not act for other keys")
    target = keys.named(name)
    if target is None:
        raise Refused(403, f"no key named {name[:64]!r} to act for")
    return Identity(key=target, via="operator" if entry is None else entry.name)
