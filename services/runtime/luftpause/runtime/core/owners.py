"""Which key of the keys file a run belongs to, and whether that key may have it.

Pure module: no I/O. A run belongs to the key that authenticated the MCP request spawning it
(`common.auth.Identity`), or, for a child, to its parent's key, so a whole run tree counts
against one key's budget at the dataplane. A plain key may not hang a child under another
key's run; the operator (the token) and a service key may, and the child stays its parent's.
The run's class must be one its key may use. Without keys nothing changes: no run has a key.
"""

from __future__ import annotations

from dataclasses import replace

from luftpause.common.auth import Identity
from luftpause.common.keys import Keys
from luftpause.runtime.core.errors import RequestError
from luftpause.runtime.core.values import RunSpec


def owned(
    spec: RunSpec, identity: Identity, *, parent: RunSpec | None, keys: Keys | None
) -> RunSpec:
    """`spec` with the key it belongs to; `RequestError` if that key may not have it."""
    key = identity.caller or None
    if parent is not None and parent.key is not None:
        if key is not None and key != parent.key and not _acts(identity):
            raise RequestError(f"run {parent.handle} belongs to another key than {key!r}")
        key = parent.key
    if key is not None and keys is not None:
        entry = keys.named(key)
        if entry is None:
            raise RequestError(f"key {key!r} is no longer in the keys file")
        if not entry.may_use(spec.service_class):
            raise RequestError(f"key {key!r} may not use class {spec.service_class!r}")
    return replace(spec, key=key)


def may_touch(run_key: str | None, identity: Identity) -> bool:
    """Whether `identity` may see, await, cancel, approve or forecast a run of `run_key`: its
    own key's runs; any run for the operator (or no auth) and for a service key."""
    key = identity.caller or None
    return key is None or _acts(identity) or run_key == key


def _acts(identity: Identity) -> bool:
    """A service key speaking for itself (not through on-behalf-of) may act for any key."""
    return identity.key is not None and identity.key.acts_for and not identity.via
