"""Who a turn belongs to: its run, its service class and its caller.

Pure module: no I/O; time arrives as an argument (monotonic seconds). The shell reads the
headers and the parsed body and asks this module; `ToolCallMemory` is the dataplane's memory of
the tool call ids it saw in replies, so an agent that sends no run header is recognised by the
ids it echoes back in its `role: "tool"` messages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import IntEnum
from typing import Any

from luftpause.dataplane.errors import BadRequest

TOOL_CALL_MEMORY_SECONDS = 30 * 60
CALLER_MAX_BYTES = 128
RUN_ID_MAX_BYTES = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ServiceClass(IntEnum):
    """Numbered as the proto's ServiceClass."""

    INTERACTIVE = 1
    BATCH = 2


_CLASSES = {"interactive": ServiceClass.INTERACTIVE, "batch": ServiceClass.BATCH}


def parse_service_class(raw: str | None) -> ServiceClass:
    """`x-luftpause-class`: absent means interactive; anything but the two names is an error."""
    if raw is None:
        return ServiceClass.INTERACTIVE
    try:
        return _CLASSES[raw.strip().lower()]
    except KeyError:
        raise BadRequest(
            f"x-luftpause-class must be 'interactive' or 'batch', got {raw[:64]!r}"
        ) from None


def check_run_id(raw: str | None) -> str:
    """A run id without surrounding space; `BadRequest` unless UTF-8 within 256 bytes and
    free of control characters.

    A run id goes to the scheduler (protobuf strings must be UTF-8) and back in every response
    header (where aiohttp refuses control characters), so one that is not valid UTF-8 (surrogate
    escapes), holds a control character (possible in a URL path) or is very long is refused.
    """
    run_id = (raw or "").strip()
    try:
        size = len(run_id.encode())
    except UnicodeEncodeError:
        raise BadRequest("the run id (x-luftpause-run-id) must be valid UTF-8") from None
    if size > RUN_ID_MAX_BYTES:
        raise BadRequest(
            f"the run id (x-luftpause-run-id) must be at most {RUN_ID_MAX_BYTES} bytes"
        )
    if _CONTROL.search(run_id):
        raise BadRequest("the run id (x-luftpause-run-id) must not contain control characters")
    return run_id


def cut_caller(raw: str | None) -> str:
    """`x-luftpause-caller` cut to 128 bytes of UTF-8 without splitting a character."""
    if not raw:
        return ""
    if len(raw) <= CALLER_MAX_BYTES and raw.isascii():
        return raw
    # Bytes that are not UTF-8 arrive as surrogate escapes; 'ignore' drops them with the cut.
    data = raw.encode("utf-8", "surrogateescape")
    return data[:CALLER_MAX_BYTES].decode("utf-8", "ignore")


def narrow_caller(base: str, raw: str | None) -> str:
    """The caller of a turn whose key is `base` ("" for none): `x-luftpause-caller` may only
    narrow it. A header equal to `base` or under `base/` is taken as is, any other becomes
    `base/<header>`, so a key never speaks for another; then cut as `cut_caller` does (a key's
    name is at most 64 bytes, so the cut never reaches it)."""
    if not base:
        return cut_caller(raw)
    sub = (raw or "").strip()
    if sub and sub != base and not sub.startswith(base + "/"):
        sub = f"{base}/{sub}"
    return cut_caller(sub or base)


def echoed_tool_call_ids(messages: list[Any]) -> Iterable[str]:
    """The `tool_call_id`s of the request's tool messages, latest first."""
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if isinstance(call_id, str) and call_id:
                yield call_id


class ToolCallMemory:
    """Tool call id -> run id, each remembered for 30 minutes after it was last seen."""

    __slots__ = ("_entries", "ttl")

    def __init__(self, ttl: float = TOOL_CALL_MEMORY_SECONDS) -> None:
        self.ttl = ttl
        self._entries: dict[str, tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, ids: Iterable[str], run_id: str, now: float) -> None:
        """Note that these tool calls were made by `run_id`."""
        expires = now + self.ttl
        for call_id in ids:
            self._entries[call_id] = (run_id, expires)

    def recognise(self, ids: Iterable[str], now: float) -> str | None:
        """The run that made the first of these tool calls still remembered, if any."""
        if not self._entries:
            return None
        for call_id in ids:
            entry = self._entries.get(call_id)
            if entry is not None and entry[1] > now:
                return entry[0]
        return None

    def forget_run(self, run_id: str) -> None:
        """Drop every id of an ended run."""
        for call_id in [k for k, (run, _) in self._entries.items() if run == run_id]:
            del self._entries[call_id]

    def prune(self, now: float) -> int:
        """Drop expired ids; return how many went."""
        expired = [k for k, (_, expires) in self._entries.items() if expires <= now]
        for call_id in expired:
            del self._entries[call_id]
        return len(expired)
