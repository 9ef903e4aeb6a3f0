"""Keys per caller: the keys file, its validation, and its reloading.

Pure module apart from `load_keys`, which reads a file, and `KeysFile`, the small shell that
reloads it when it changes. The dataplane and the runtime check a presented bearer against it
(`common.auth.authenticate`); `luftpause keys` (`common.keys_cli`) hashes and makes keys.

File format (YAML, or TOML by extension)::

    keys:
      - name: team-a                    # the caller this key is (unique, see NAME below)
        sha256: 9f86d081884c7d65...     # hex SHA-256 of the key: keys are never stored in clear
        classes: [interactive, batch]   # the classes it may use (optional, default both)
        tokens_per_minute: 20000        # its own budgets (optional; 0 or absent: none)
        requests_per_minute: 60
        daily_tokens: 2000000           # tokens per UTC day
      - name: runtime
        sha256: 2c26b46b68ffc68f...
        acts_for: true                  # a service key: may act for other keys (the runtime)

A name is 1 to 64 ASCII letters, digits and `. _ - : @ +`, starting with a letter or digit (no
`/`: the caller a key sends may only narrow it, `team-a/agent-7`). Names and hashes are unique.

A presented key is hashed and found by its hash; the hashes are compared in constant time.
`KeysFile` looks at the file at most once a second (`stat`, following symlinks, so a Kubernetes
Secret's swapped `..data` link counts) and loads it again when its inode, size or modification
time changed; a file that fails to load then keeps the keys it had, with an error in the log.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from luftpause.common.files import load_structured

CLASSES = ("interactive", "batch")
NAME_MAX_BYTES = 64
CHECK_SECONDS = 1.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]*")
_HEX = re.compile(r"[0-9a-f]{64}")
_BUDGETS = ("tokens_per_minute", "requests_per_minute", "daily_tokens")
_FIELDS = frozenset({"name", "sha256", "classes", "acts_for", *_BUDGETS})

log = structlog.get_logger("luftpause.keys")


class KeysError(ValueError):
    """The keys file is invalid or unreadable; the message names the entry."""


def hash_key(key: str) -> str:
    """The hex SHA-256 of a key, as the keys file stores it (surrounding space dropped)."""
    return hashlib.sha256(key.strip().encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyEntry:
    """One key of the file: who it is, what it may use, its own budget."""

    name: str
    digest: bytes = field(repr=False)
    classes: frozenset[str] = frozenset(CLASSES)
    tokens_per_minute: int = 0
    requests_per_minute: int = 0
    daily_tokens: int = 0
    acts_for: bool = False

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or len(self.name) > NAME_MAX_BYTES:
            raise KeysError(
                f"key name {self.name!r} must be 1 to {NAME_MAX_BYTES} ASCII letters, digits "
                "and . _ - : @ +, starting with a letter or digit"
            )
        if len(self.digest) != hashlib.sha256().digest_size:
            raise KeysError(f"key {self.name}: the digest must be 32 bytes")
        if not self.classes or not self.classes <= set(CLASSES):
            raise KeysError(f"key {self.name}: classes must be some of {', '.join(CLASSES)}")
        if min(self.tokens_per_minute, self.requests_per_minute, self.daily_tokens) < 0:
            raise KeysError(f"key {self.name}: budgets must be >= 0")

    @property
    def has_budget(self) -> bool:
        """True if any of its budgets is set."""
        return bool(self.tokens_per_minute or self.requests_per_minute or self.daily_tokens)

    def may_use(self, service_class: str) -> bool:
        return service_class in self.classes


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys of one version of the file, by hash and by name."""

    entries: tuple[KeyEntry, ...] = ()
    _by_hash: Mapping[bytes, KeyEntry] = field(init=False, repr=False, compare=False)
    _by_name: Mapping[str, KeyEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_hash: dict[bytes, KeyEntry] = {}
        by_name: dict[str, KeyEntry] = {}
        for e in self.entries:
            if e.name in by_name:
                raise KeysError(f"key {e.name}: the name is used twice")
            if e.digest in by_hash:
                raise KeysError(f"key {e.name}: same sha256 as key {by_hash[e.digest].name}")
            by_hash[e.digest], by_name[e.name] = e, e
        object.__setattr__(self, "_by_hash", by_hash)
        object.__setattr__(self, "_by_name", by_name)

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, presented: bytes) -> KeyEntry | None:
        """The entry of a presented key, None if the file has no such key."""
        digest = hashlib.sha256(presented.strip()).digest()
        entry = self._by_hash.get(digest)
        if entry is None or not hmac.compare_digest(entry.digest, digest):
            return None
        return entry

    def named(self, name: str) -> KeyEntry | None:
        return self._by_name.get(name)


def parse_entry(raw: Any, index: int) -> KeyEntry:
    """One entry of the `keys` list."""
    where = f"keys[{index}]"
    if not isinstance(raw, Mapping):
        raise KeysError(f"{where} must be a mapping")
    name = raw.get("name")
    if not isinstance(name, str):
        raise KeysError(f"{where}: 'name' must be a string")
    where = f"{where} ({name})"
    unknown = set(raw) - _FIELDS
    if unknown:
        raise KeysError(f"{where}: unknown fields {sorted(unknown)}")
    digest = raw.get("sha256")
    if not isinstance(digest, str) or not _HEX.fullmatch(digest.strip().lower()):
        raise KeysError(f"{where}: 'sha256' must be 64 hex digits (`luftpause keys hash`)")
    acts_for = raw.get("acts_for", False)
    if not isinstance(acts_for, bool):
        raise KeysError(f"{where}: 'acts_for' must be true or false")
    budgets = {b: _count(raw.get(b, 0), f"{where}.{b}") for b in _BUDGETS}
    try:
        return KeyEntry(
            name=name,
            digest=bytes.fromhex(digest.strip()),
            classes=_classes(raw.get("classes", list(CLASSES)), where),
            acts_for=acts_for,
            **budgets,
        )
    except KeysError as exc:
        raise KeysError(f"{where}: {exc}") from None


def _classes(value: Any, where: str) -> frozenset[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise KeysError(f"{where}: 'classes' must be a non-empty list of {', '.join(CLASSES)}")
    unknown = sorted(set(value) - set(CLASSES))
    if unknown:
        raise KeysError(f"{where}: unknown classes {unknown}; use {', '.join(CLASSES)}")
    return frozenset(value)


def _count(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise KeysError(f"{where} must be a whole number >= 0, got {value!r}")
    return value


def parse_keys(raw: Any) -> Keys:
    """The keys of a file's parsed content."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("keys"), list):
        raise KeysError("the keys file must be a mapping with a 'keys' list")
    unknown = set(raw) - {"keys"}
    if unknown:
        raise KeysError(f"the keys file has unknown fields {sorted(unknown)}")
    return Keys(tuple(parse_entry(e, i) for i, e in enumerate(raw["keys"])))


def load_keys(path: str | Path) -> Keys:
    """Read and validate a YAML or TOML keys file."""
    p = Path(path)
    raw = load_structured(p, "keys file", KeysError)
    try:
        return parse_keys(raw)
    except KeysError as exc:
        raise KeysError(f"keys file {p}: {exc}") from None


Signature = tuple[int, int, int, int]


def _signature(path: Path) -> Signature:
    """What tells one version of the file from the next (the target of any symlinks)."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class KeysFile:
    """The keys file, loaded again when it changes; `KeysError` at once if it cannot load."""

    def __init__(
        self,
        path: str | Path,
        *,
        check_seconds: float = CHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.check_seconds = check_seconds
        self._clock = clock
        try:
            self._signature: Signature | None = _signature(self.path)
        except OSError as exc:
            raise KeysError(f"cannot read keys file {self.path}: {exc}") from exc
        self._keys = load_keys(self.path)
        self._checked = clock()
        self._complaint = ""

    def current(self) -> Keys:
        """The keys now: the file is looked at again at most every `check_seconds`."""
        now = self._clock()
        if now - self._checked >= self.check_seconds:
            self._checked = now
            self._reload_if_changed()
        return self._keys

    def lookup(self, presented: bytes) -> KeyEntry | None:
        """The entry of a presented key (the file reloaded first if it changed)."""
        return self.current().find(presented)

    def _reload_if_changed(self) -> None:
        try:
            signature: Signature | None = _signature(self.path)
        except OSError as exc:
            signature = None
            self._complain(f"cannot read keys file {self.path}: {exc}")
        if signature is None or signature == self._signature:
            return
        self._signature = signature
        try:
            keys = load_keys(self.path)
        except KeysError as exc:
            self._complain(str(exc))
            return
        self._keys, self._complaint = keys, ""
        log.info("keys file reloaded", path=str(self.path), keys=len(keys))

    def _complain(self, message: str) -> None:
        """Log an error once per new problem (not every second while it lasts)."""
        if message != self._complaint:
            self._complaint = message
            log.error("keys file not reloaded; keeping the previous keys", error=message)
