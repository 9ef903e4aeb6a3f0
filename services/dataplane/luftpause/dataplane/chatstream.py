"""A chat completion reply read as events, for the translators to other APIs.

Pure module: no I/O, no clock. `ChatReader` reads an engine's Chat Completions SSE stream
incrementally (`feed()` any chunk of bytes, `flush()` at its end) and gives, per chunk, the
events it completed; `completion_events` gives the same events for a whole (non-stream) body.
Both note what the turn path reports (first token, finish reason, usage, tool call ids) in a
`ReplySummary`, as `sse.SseObserver` and `reply.summarize_completion` do for a reply relayed
unchanged.

The events, in the order a reply makes them (choice 0 only; `n` > 1 is not translated):

    Begin(id, model, created)        the first chunk
    Reasoning(text)                  `reasoning_content` (or `reasoning`) text
    Text(text)                       `content` text
    CallStart(index, id, name)       a tool call's first delta
    CallArgs(index, text)            a piece of its arguments
    Finish(reason)                   `finish_reason`
    Used(usage)                      the usage chunk (`stream_options.include_usage`)
    Failed(message)                  an error chunk (vLLM sends `{"error": ...}` mid-stream)
    Done()                           `data: [DONE]`

`Translation` joins a reader to a `Writer` of another API (`messages.reply`, `responses.reply`):
engine bytes in, the client's bytes out, chunk by chunk; `translate_body` does the same for a
whole body.

Cost: every `data:` line is JSON-decoded once (a translator needs every delta); a line is
otherwise never copied but for the bytes held back across a chunk boundary.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, cast

from luftpause.dataplane.apis import error_message
from luftpause.dataplane.reply import ReplySummary, Usage, summarize, usage_of
from luftpause.dataplane.sse import LineDecoder

_decode = json.JSONDecoder().decode


@dataclass(frozen=True, slots=True)
class Begin:
    id: str
    model: str
    created: int


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class CallArgs:
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class Finish:
    reason: str


@dataclass(frozen=True, slots=True)
class Used:
    usage: Usage


@dataclass(frozen=True, slots=True)
class Failed:
    message: str


@dataclass(frozen=True, slots=True)
class Done:
    pass


Event: TypeAlias = Begin | Reasoning | Text | CallStart | CallArgs | Finish | Used | Failed | Done


class _Facts:
    """What the events said, for the turn's report."""

    __slots__ = ("any_calls", "finish_reason", "first_token", "ids", "usage")

    def __init__(self) -> None:
        self.finish_reason = ""
        self.usage: Usage | None = None
        self.ids: list[str] = []
        self.any_calls = False
        self.first_token = False

    def note(self, event: Event) -> None:
        kind = type(event)  # the events are final classes: `is` is the cheap test
        if kind is Text or kind is Reasoning:
            self.first_token = self.first_token or bool(cast(Text, event).text)
        elif kind is CallStart:
            call = cast(CallStart, event)
            self.first_token = self.any_calls = True
            if call.id and call.id not in self.ids:
                self.ids.append(call.id)
        elif kind is Finish:
            self.finish_reason = cast(Finish, event).reason
        elif kind is Used:
            self.usage = cast(Used, event).usage

    def summary(self) -> ReplySummary:
        return summarize(self.finish_reason, self.usage, self.ids, self.any_calls)


def _text(delta: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        value = delta.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


class ChatReader:
    """Read a Chat Completions SSE stream into events; see the module docstring."""

    __slots__ = ("_begun", "_calls", "_facts", "_lines")

    def __init__(self) -> None:
        self._lines = LineDecoder()
        self._facts = _Facts()
        self._begun = False
        # Tool call index -> id, for the calls already started.
        self._calls: dict[int, str] = {}

    @property
    def first_token(self) -> bool:
        """True once the stream carried its first token (text, reasoning or a tool call)."""
        return self._facts.first_token

    def summary(self) -> ReplySummary:
        """What the stream said so far."""
        return self._facts.summary()

    @property
    def call_ids(self) -> Sequence[str]:
        """The tool call ids the stream has carried so far, in order."""
        return self._facts.ids

    def feed(self, data: bytes) -> list[Event]:
        """The events completed by `data`."""
        return self._events(self._lines.feed(data))

    def flush(self) -> list[Event]:
        """The events of an unterminated last line, at the end of the stream."""
        return self._events(self._lines.flush())

    def _events(self, lines: list[bytes]) -> list[Event]:
        out: list[Event] = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                out.append(Done())
                continue
            try:
                chunk = _decode(payload.decode("utf-8", "replace"))
            except ValueError:
                continue
            if isinstance(chunk, dict):
                out.extend(self._chunk(chunk))
        for event in out:
            self._facts.note(event)
        return out

    def _chunk(self, chunk: Mapping[str, Any]) -> Iterator[Event]:
        if "error" in chunk and "choices" not in chunk:
            yield Failed(error_message(json.dumps(chunk).encode()))
            return
        if not self._begun:
            self._begun = True
            yield _begin(chunk)
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                yield from self._delta(delta)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                yield Finish(reason)
        usage = usage_of(chunk.get("usage"))
        if usage is not None:
            yield Used(usage)

    def _delta(self, delta: Mapping[str, Any]) -> Iterator[Event]:
        if reasoning := _text(delta, "reasoning_content", "reasoning"):
            yield Reasoning(reasoning)
        if text := _text(delta, "content"):
            yield Text(text)
        calls = delta.get("tool_calls")
        for position, call in enumerate(calls if isinstance(calls, list) else ()):
            if isinstance(call, dict):
                yield from self._call(call, position)

    def _call(self, call: Mapping[str, Any], position: int) -> Iterator[Event]:
        index = call.get("index", position)
        if not isinstance(index, int):
            index = position
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        if index not in self._calls:
            call_id = call.get("id")
            self._calls[index] = call_id if isinstance(call_id, str) else ""
            name = function.get("name")
            yield CallStart(index, self._calls[index], name if isinstance(name, str) else "")
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            yield CallArgs(index, arguments)


def _begin(chunk: Mapping[str, Any]) -> Begin:
    id_ = chunk.get("id")
    model = chunk.get("model")
    created = chunk.get("created")
    return Begin(
        id=id_ if isinstance(id_, str) else "",
        model=model if isinstance(model, str) else "",
        created=created if isinstance(created, int) and not isinstance(created, bool) else 0,
    )


def completion_events(body: bytes) -> tuple[list[Event], ReplySummary]:
    """A whole chat completion body as the events its stream would have made; ValueError if
    the body is not a chat completion."""
    doc = json.loads(body)
    if not isinstance(doc, Mapping) or not isinstance(doc.get("choices"), list):
        raise ValueError("not a chat completion")
    events: list[Event] = [_begin(doc)]
    choice = next((c for c in doc["choices"] if isinstance(c, Mapping)), {})
    message = choice.get("message")
    message = message if isinstance(message, Mapping) else {}
    if reasoning := _text(message, "reasoning_content", "reasoning"):
        events.append(Reasoning(reasoning))
    if text := _text(message, "content"):
        events.append(Text(text))
    calls = message.get("tool_calls")
    for index, call in enumerate(calls if isinstance(calls, list) else ()):
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        call_id, name = call.get("id"), function.get("name")
        events.append(
            CallStart(
                index,
                call_id if isinstance(call_id, str) else "",
                name if isinstance(name, str) else "",
            )
        )
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            events.append(CallArgs(index, arguments))
    reason = choice.get("finish_reason")
    if isinstance(reason, str) and reason:
        events.append(Finish(reason))
    usage = usage_of(doc.get("usage"))
    if usage is not None:
        events.append(Used(usage))
    facts = _Facts()
    for event in events:
        facts.note(event)
    return events, facts.summary()


class Writer(Protocol):
    """Another API's reply written from chat events (`messages.reply`, `responses.reply`)."""

    def write(self, events: list[Event]) -> bytes:
        """The bytes these events make (b"" for a writer building a whole body)."""
        ...

    def finish(self) -> bytes:
        """The bytes that end the reply, if the events did not."""
        ...

    def document(self) -> dict[str, Any]:
        """The whole reply as the events so far made it."""
        ...


class Translation:
    """An engine's chat stream in, another API's stream out, event by event."""

    __slots__ = ("_reader", "_writer")

    def __init__(self, writer: Writer) -> None:
        self._reader = ChatReader()
        self._writer = writer

    @property
    def first_token(self) -> bool:
        return self._reader.first_token

    def summary(self) -> ReplySummary:
        return self._reader.summary()

    @property
    def call_ids(self) -> Sequence[str]:
        return self._reader.call_ids

    def feed(self, data: bytes) -> bytes:
        """The client's bytes for these engine bytes (often b"" until a line completes)."""
        return self._writer.write(self._reader.feed(data))

    def flush(self) -> bytes:
        """The client's last bytes, once the engine's stream has ended."""
        return self._writer.write(self._reader.flush()) + self._writer.finish()


def translate_body(body: bytes, writer: Writer) -> tuple[bytes, ReplySummary]:
    """A whole chat completion as `writer`'s API writes it; ValueError if it is not one."""
    events, summary = completion_events(body)
    writer.write(events)
    writer.finish()
    return json.dumps(writer.document(), ensure_ascii=False).encode(), summary
