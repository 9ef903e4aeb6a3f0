"""What every translation of a chat reply into another API shares: a reply as parts, in order.

Pure module: no I/O. Both the Messages API and the Responses API write a reply as a sequence of
parts, each opened, filled and closed before the next opens: a text part, a reasoning part, one
part per tool call (content blocks in the one, output items in the other), framed by a start and
an end of the whole reply. `PartWriter` follows the events `chatstream` reads and calls its
subclass at each step (`messages.reply.MessagesWriter`, `responses.reply.ResponsesWriter`):

    _begin(out)                      the reply starts (the engine's first chunk)
    _open_text(kind, out) -> index   a text part opens, kind "text" or "reasoning"
    _add_text(index, kind, text, out)
    _open_call(call, out) -> index   a tool call's part opens
    _add_args(index, text, live, out)   a piece of its arguments (`live`: the part is open;
                                     a call an engine continues after the next one started is
                                     completed in the whole reply only)
    _close_part(index, out)
    _end(out)                        the reply ends (finish reason and usage are known)
    _fail(message, out)              the engine said it failed mid-reply: nothing follows

Each step appends its frames to `out` (a subclass writes none when not streaming); `document()`
is the whole reply as the events so far made it, the non-stream reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from luftpause.dataplane.chatstream import (
    Begin,
    CallArgs,
    CallStart,
    Done,
    Event,
    Failed,
    Finish,
    Reasoning,
    Text,
    Used,
)
from luftpause.dataplane.reply import Usage

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def frame(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event with its name, as both APIs write them."""
    return f"event: {event}\ndata: {_encode(data)}\n\n".encode()


class PartWriter:
    """A chat reply's events as parts of another API's reply; see the module docstring."""

    __slots__ = (
        "_calls",
        "_created",
        "_ended",
        "_id",
        "_open",
        "_reason",
        "_started",
        "_stream",
        "_usage",
    )

    def __init__(self, *, stream: bool) -> None:
        self._stream = stream
        # The engine's reply id and creation time (its first chunk's).
        self._id = ""
        self._created = 0
        self._started = False
        self._ended = False
        # The open part: its index and what it is ("text" | "reasoning" | a chat call index).
        self._open: tuple[int, str | int] | None = None
        # Chat tool call index -> its part's index.
        self._calls: dict[int, int] = {}
        self._reason = ""
        self._usage: Usage | None = None

    def write(self, events: list[Event]) -> bytes:
        """The frames these events make (b"" when not streaming)."""
        out: list[bytes] = []
        for event in events:
            self._event(event, out)
        return b"".join(out) if self._stream else b""

    def finish(self) -> bytes:
        """End the reply unless it ended already (or failed)."""
        if self._ended:
            return b""
        out: list[bytes] = []
        self._start(out)
        self._close(out)
        self._ended = True
        self._end(out)
        return b"".join(out) if self._stream else b""

    def document(self) -> dict[str, Any]:
        raise NotImplementedError

    def _event(self, event: Event, out: list[bytes]) -> None:
        if not self._ended:
            _STEPS[type(event)](self, event, out)

    def _on_text(self, event: Text | Reasoning, out: list[bytes]) -> None:
        self._text("text" if type(event) is Text else "reasoning", event.text, out)

    def _on_args(self, event: CallArgs, out: list[bytes]) -> None:
        part = self._calls.get(event.index)
        if part is not None:
            self._add_args(part, event.text, self._open == (part, event.index), out)

    def _on_begin(self, event: Begin, out: list[bytes]) -> None:
        self._id = self._id or event.id
        self._created = self._created or event.created
        self._start(out)

    def _on_call(self, event: CallStart, out: list[bytes]) -> None:
        self._start(out)
        self._close(out)
        self._calls[event.index] = index = self._open_call(event, out)
        self._open = (index, event.index)

    def _on_finish(self, event: Finish, out: list[bytes]) -> None:
        self._reason = event.reason
        self._close(out)

    def _on_usage(self, event: Used, out: list[bytes]) -> None:
        self._usage = event.usage

    def _on_failure(self, event: Failed, out: list[bytes]) -> None:
        self._ended = True
        self._fail(event.message, out)

    def _on_done(self, event: Done, out: list[bytes]) -> None:
        out.append(self.finish())

    def _start(self, out: list[bytes]) -> None:
        if not self._started:
            self._started = True
            self._begin(out)

    def _text(self, kind: str, text: str, out: list[bytes]) -> None:
        if self._open is not None and self._open[1] == kind:
            index = self._open[0]
        else:
            self._start(out)
            self._close(out)
            index = self._open_text(kind, out)
            self._open = (index, kind)
        self._add_text(index, kind, text, out)

    def _close(self, out: list[bytes]) -> None:
        if self._open is not None:
            index = self._open[0]
            self._open = None
            self._close_part(index, out)

    # --- what a subclass writes at each step ---------------------------------------------------

    def _begin(self, out: list[bytes]) -> None:
        raise NotImplementedError

    def _open_text(self, kind: str, out: list[bytes]) -> int:
        raise NotImplementedError

    def _add_text(self, index: int, kind: str, text: str, out: list[bytes]) -> None:
        raise NotImplementedError

    def _open_call(self, call: CallStart, out: list[bytes]) -> int:
        raise NotImplementedError

    def _add_args(self, index: int, text: str, live: bool, out: list[bytes]) -> None:
        raise NotImplementedError

    def _close_part(self, index: int, out: list[bytes]) -> None:
        raise NotImplementedError

    def _end(self, out: list[bytes]) -> None:
        raise NotImplementedError

    def _fail(self, message: str, out: list[bytes]) -> None:
        raise NotImplementedError


# Each event's step, by its class (one dict lookup per event, on the hot path of every chunk).
_STEPS: dict[type, Callable[[PartWriter, Any, list[bytes]], None]] = {
    Text: PartWriter._on_text,
    Reasoning: PartWriter._on_text,
    CallArgs: PartWriter._on_args,
    Begin: PartWriter._on_begin,
    CallStart: PartWriter._on_call,
    Finish: PartWriter._on_finish,
    Used: PartWriter._on_usage,
    Failed: PartWriter._on_failure,
    Done: PartWriter._on_done,
}
