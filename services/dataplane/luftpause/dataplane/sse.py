"""Incremental reading of an engine's server-sent events, for facts only: bytes pass unchanged.

Pure module: no I/O, no clock. `LineDecoder` splits bytes into lines across arbitrary chunk
boundaries (LF, CRLF or CR, as the SSE spec allows), the way httpx's `LineDecoder` does for
text. `SseObserver` reads the `data:` lines of an OpenAI chat completion stream and notes the
first token, usage, finish reason and tool call ids. `NamedEvents` pairs each `data:` line with
the `event:` name before it, for the streams of the Messages and Responses APIs; their observers
(`messages.observe`, `responses.observe`) are `EventObserver`s, which decide by the name which
payloads to decode.

Cost: until the first token every `data:` line is JSON-decoded (one or two lines). After it a
line is decoded only if it mentions `tool_calls`, or a `finish_reason` / `usage` that is not
`null`, so plain content chunks cost two or three `bytes.find` calls. A chunk of whole lines
(nothing held back from the last one) that holds none of those and no `[DONE]` is passed over
without being split into lines at all: after the first token its lines could tell nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from luftpause.dataplane.reply import ReplySummary, Usage, summarize, tool_call_ids_of, usage_of

_TOKEN_KEYS = ("content", "reasoning_content", "reasoning")
_SKIP = frozenset(b" \t:")


class LineDecoder:
    """Split a byte stream into lines without their terminators."""

    __slots__ = ("_buffer", "_cr")

    def __init__(self) -> None:
        self._buffer = b""
        self._cr = False

    def feed(self, data: bytes) -> list[bytes]:
        """Return the lines completed by `data`."""
        if self._cr:
            self._cr = False
            if data.startswith(b"\n"):
                data = data[1:]
        buf = self._buffer + data if self._buffer else data
        if b"\r" in buf:
            # A trailing CR ends its line now; a LF opening the next chunk belongs to it.
            self._cr = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buffer = lines.pop()
        return lines

    @property
    def at_line_start(self) -> bool:
        """True if no part of a line is held back and no CR awaits its LF."""
        return not self._buffer and not self._cr

    def flush(self) -> list[bytes]:
        """Return the unterminated last line, if any, at the end of the stream."""
        rest, self._buffer, self._cr = self._buffer, b"", False
        return [rest] if rest else []


class NamedEvents:
    """Split a stream of named server-sent events into (name, data) pairs as they complete."""

    __slots__ = ("_lines", "_name")

    def __init__(self) -> None:
        self._lines = LineDecoder()
        self._name = b""

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The `data:` payloads completed by `data`, each with its event's name (b"" if none)."""
        return self._pairs(self._lines.feed(data))

    def flush(self) -> list[tuple[bytes, bytes]]:
        """The payload of an unterminated last line, at the end of the stream."""
        return self._pairs(self._lines.flush())

    def _pairs(self, lines: list[bytes]) -> list[tuple[bytes, bytes]]:
        out = []
        for line in lines:
            if line.startswith(b"data:"):
                out.append((self._name, line[5:].strip()))
            elif line.startswith(b"event:"):
                self._name = line[6:].strip()
            elif not line:
                self._name = b""  # a blank line ends the event
        return out


class EventObserver:
    """Watch a stream of named events for a turn's facts; `feed` says when the first token has
    just arrived. A subclass says which events to decode (`_decodes`, which may note the first
    token from the name alone) and reads each decoded one (`_event`)."""

    __slots__ = ("_events", "first_token")

    def __init__(self) -> None:
        self._events = NamedEvents()
        self.first_token = False

    def feed(self, data: bytes) -> bool:
        """Read a chunk of the stream; True iff it carried the first token."""
        return self._read(self._events.feed(data))

    def flush(self) -> bool:
        """Read the unterminated tail at the end of the stream."""
        return self._read(self._events.flush())

    def summary(self) -> ReplySummary:
        raise NotImplementedError

    @property
    def call_ids(self) -> Sequence[str]:
        """The tool call ids the stream has carried so far, in order."""
        raise NotImplementedError

    def _decodes(self, name: bytes) -> bool:
        raise NotImplementedError

    def _event(self, event: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _read(self, events: list[tuple[bytes, bytes]]) -> bool:
        was = self.first_token
        for name, payload in events:
            if not self._decodes(name):
                continue
            try:
                event = json.loads(payload)
            except ValueError:
                continue
            if isinstance(event, Mapping):
                self._event(event)
        return self.first_token and not was


def _may_tell(data: bytes) -> bool:
    """False only if no line in `data` can hold a fact once the first token is known."""
    return (
        b"\r" in data
        or b"[DONE]" in data
        or b'"tool_calls"' in data
        or _has_value(data, b'"finish_reason"')
        or _has_value(data, b'"usage"')
    )


def _has_value(line: bytes, key: bytes) -> bool:
    """True if `key` occurs followed by something other than `null`."""
    i = line.find(key)
    while i != -1:
        j = i + len(key)
        while j < len(line) and line[j] in _SKIP:
            j += 1
        if not line.startswith(b"null", j):
            return True
        i = line.find(key, j)
    return False


class SseObserver:
    """Watch a chat completion stream; `feed` says when the first token has just arrived."""

    __slots__ = ("_any_calls", "_finish_reason", "_ids", "_lines", "_usage", "done", "first_token")

    def __init__(self) -> None:
        self._lines = LineDecoder()
        self._finish_reason = ""
        self._usage: Usage | None = None
        self._ids: list[str] = []
        self._any_calls = False
        self.first_token = False
        self.done = False

    def feed(self, data: bytes) -> bool:
        """Read a chunk of the stream; True iff this chunk carried the first token."""
        was = self.first_token
        if was and data.endswith(b"\n") and self._lines.at_line_start and not _may_tell(data):
            return False
        for line in self._lines.feed(data):
            self._line(line)
        return self.first_token and not was

    def flush(self) -> bool:
        """Read the unterminated tail at the end of the stream; True iff it had the first token."""
        was = self.first_token
        for line in self._lines.flush():
            self._line(line)
        return self.first_token and not was

    def summary(self) -> ReplySummary:
        """What the stream said so far."""
        return summarize(self._finish_reason, self._usage, self._ids, self._any_calls)

    @property
    def call_ids(self) -> Sequence[str]:
        """The tool call ids the stream has carried so far, in order."""
        return self._ids

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        if self.first_token and not (
            b'"tool_calls"' in payload
            or _has_value(payload, b'"finish_reason"')
            or _has_value(payload, b'"usage"')
        ):
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            return
        if isinstance(chunk, Mapping):
            self._chunk(chunk)

    def _chunk(self, chunk: Mapping[str, Any]) -> None:
        usage = usage_of(chunk.get("usage"))
        if usage is not None:
            self._usage = usage
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, Mapping):
                continue
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._finish_reason = reason
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                self._delta(delta)

    def _delta(self, delta: Mapping[str, Any]) -> None:
        if tool_call_ids_of(delta.get("tool_calls"), self._ids):
            self._any_calls = True
            self.first_token = True
        elif not self.first_token and any(delta.get(key) for key in _TOKEN_KEYS):
            self.first_token = True
