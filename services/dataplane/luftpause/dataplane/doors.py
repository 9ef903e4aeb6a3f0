"""The three doors a turn comes in by, and what its request and reply become on the way.

Pure module: no I/O. A `Door` per API (Chat Completions, the Messages API, the Responses API)
reads a request into an `Ask`: what the turn path needs whatever the API (model, reserved reply
tokens, the tool call ids it echoes, its opening). Once the turn is placed, `upstream` says what
goes to that replica, by the APIs the endpoint file says it serves:

- it serves the client's API: the client's bytes go to the same path, and the reply's bytes come
  back unchanged, read on the way by that API's observer (`Passing`);
- else it serves Chat Completions: the request goes translated to `/v1/chat/completions`, and
  the reply comes back translated event by event as it streams (`chatstream.Translation`), or
  whole for a non-stream reply; an engine's refusal (4xx, 5xx) comes back in the client's API's
  error shape, its status and headers kept;
- else (None): the replica cannot take the turn.

Both kinds of reply are a `ReplyStream`: `feed(engine bytes) -> client bytes`, `flush()` at the
end, `first_token` and `summary()` for the turn's report.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from luftpause.common.prefixes import Key, opening_keys
from luftpause.dataplane.apis import PATHS, Api, error_body, error_message
from luftpause.dataplane.chatstream import Translation, Writer, translate_body
from luftpause.dataplane.forwarding import parse_turn_body
from luftpause.dataplane.identity import echoed_tool_call_ids
from luftpause.dataplane.messages import request as messages_request
from luftpause.dataplane.messages.observe import MessagesObserver, summarize_message
from luftpause.dataplane.messages.reply import MessagesWriter
from luftpause.dataplane.reply import ReplySummary, summarize_completion
from luftpause.dataplane.responses import request as responses_request
from luftpause.dataplane.responses.observe import ResponsesObserver, summarize_response
from luftpause.dataplane.responses.reply import ResponsesWriter
from luftpause.dataplane.sse import SseObserver


class ReplyStream(Protocol):
    """An engine's streamed reply on its way to the client."""

    @property
    def first_token(self) -> bool: ...

    def feed(self, data: bytes) -> bytes:
        """The client's bytes for these engine bytes."""
        ...

    def flush(self) -> bytes:
        """The client's last bytes, once the engine's stream has ended."""
        ...

    def summary(self) -> ReplySummary: ...

    @property
    def call_ids(self) -> Sequence[str]:
        """The tool call ids the reply has carried so far, in order (remembered before the
        bytes that carry them go on, so a client's next request finds its run)."""
        ...


class Observer(Protocol):
    """Reads a stream relayed unchanged (`sse.SseObserver` and the two APIs' observers)."""

    first_token: bool

    def feed(self, data: bytes) -> bool: ...

    def flush(self) -> bool: ...

    def summary(self) -> ReplySummary: ...

    @property
    def call_ids(self) -> Sequence[str]: ...


class Passing:
    """A reply relayed unchanged, read on the way by its API's observer."""

    __slots__ = ("_observer",)

    def __init__(self, observer: Observer) -> None:
        self._observer = observer

    @property
    def first_token(self) -> bool:
        return self._observer.first_token

    def feed(self, data: bytes) -> bytes:
        self._observer.feed(data)
        return data

    def flush(self) -> bytes:
        self._observer.flush()
        return b""

    def summary(self) -> ReplySummary:
        return self._observer.summary()

    @property
    def call_ids(self) -> Sequence[str]:
        return self._observer.call_ids


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """What the turn path reads of a request, whatever its API."""

    api: Api
    model: str
    # Reply tokens the request reserves (0: it sets no limit).
    max_tokens: int
    body: bytes
    # The API's own parsed request (`TurnBody`, `MessagesRequest`, `ResponsesRequest`).
    parsed: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Upstream:
    """What goes to the replica, and how its reply comes back."""

    api: Api  # the API the replica is spoken to in
    path: str
    body: bytes
    translated: bool
    stream: Callable[[], ReplyStream]
    # A whole reply body -> the client's body and the facts; ValueError if it is no reply.
    whole: Callable[[bytes], tuple[bytes, ReplySummary]]
    # An engine's refusal body (status, bytes) -> the client's; None keeps it as it is.
    refusal: Callable[[int, bytes], bytes] | None = None


def _passed(
    ask: Ask, observer: Callable[[], Observer], summary: Callable[[bytes], Any]
) -> Upstream:
    return Upstream(
        api=ask.api,
        path=PATHS[ask.api],
        body=ask.body,
        translated=False,
        stream=lambda: Passing(observer()),
        whole=lambda data: (data, summary(data)),
    )


def _translated(ask: Ask, chat: dict[str, Any], writer: Callable[[bool], Writer]) -> Upstream:
    return Upstream(
        api=Api.CHAT,
        path=PATHS[Api.CHAT],
        body=json.dumps(chat, ensure_ascii=False, separators=(",", ":")).encode(),
        translated=True,
        stream=lambda: Translation(writer(True)),
        whole=lambda data: translate_body(data, writer(False)),
        refusal=lambda status, data: error_body(ask.api, status, error_message(data)),
    )


class Door(Protocol):
    api: Api

    def read(self, body: bytes) -> Ask:
        """The request in `body`; `BadRequest` if malformed."""
        ...

    def echoed(self, ask: Ask) -> Iterable[str]:
        """The tool call ids the request echoes back, latest first."""
        ...

    def opening(self, ask: Ask) -> tuple[Key, ...]:
        """The keys of the request's opening (`common.prefixes`)."""
        ...

    def upstream(self, ask: Ask, serves: frozenset[Api]) -> Upstream | None:
        """What goes to a replica serving `serves`; None if it can take no turn of this API.
        `BadRequest` if the request cannot be translated."""
        ...


class ChatDoor:
    """`POST /v1/chat/completions`."""

    api = Api.CHAT

    def read(self, body: bytes) -> Ask:
        turn = parse_turn_body(body)
        return Ask(
            api=self.api, model=turn.model, max_tokens=turn.max_tokens, body=body, parsed=turn
        )

    def echoed(self, ask: Ask) -> Iterable[str]:
        return echoed_tool_call_ids(ask.parsed.messages)

    def opening(self, ask: Ask) -> tuple[Key, ...]:
        return opening_keys(ask.parsed.messages, ask.parsed.tools)

    def upstream(self, ask: Ask, serves: frozenset[Api]) -> Upstream | None:
        if Api.CHAT not in serves:
            return None
        return _passed(ask, SseObserver, summarize_completion)


class _TranslatableDoor:
    """A door whose API an engine may serve itself; translated to Chat Completions otherwise.
    A subclass names its API's request module (`read_request`, `echoed_ids`, `opening`), its
    observer and body summary for a reply passed unchanged, and its translation."""

    api: Api
    requests: Any  # the API's request module: `messages.request` or `responses.request`
    observer: Callable[[], Observer]
    summarize: Callable[[bytes], ReplySummary]

    def read(self, body: bytes) -> Ask:
        request = self.requests.read_request(body)
        return Ask(
            api=self.api,
            model=request.model,
            max_tokens=request.max_tokens,
            body=body,
            parsed=request,
        )

    def echoed(self, ask: Ask) -> Iterable[str]:
        echoed: Iterable[str] = self.requests.echoed_ids(ask.parsed.doc)
        return echoed

    def opening(self, ask: Ask) -> tuple[Key, ...]:
        return opening_keys(*self.requests.opening(ask.parsed.doc))

    def upstream(self, ask: Ask, serves: frozenset[Api]) -> Upstream | None:
        if self.api in serves:
            return _passed(ask, self.observer, self.summarize)
        if Api.CHAT not in serves:
            return None
        return self._translated(ask)

    def _translated(self, ask: Ask) -> Upstream:
        raise NotImplementedError


class MessagesDoor(_TranslatableDoor):
    """`POST /v1/messages` (Claude Code's)."""

    api = Api.MESSAGES
    requests = messages_request
    observer = MessagesObserver
    summarize = staticmethod(summarize_message)

    def _translated(self, ask: Ask) -> Upstream:
        chat = messages_request.to_chat(ask.parsed)
        model = ask.model
        return _translated(ask, chat, lambda stream: MessagesWriter(model, stream=stream))


class ResponsesDoor(_TranslatableDoor):
    """`POST /v1/responses` (Codex's)."""

    api = Api.RESPONSES
    requests = responses_request
    observer = ResponsesObserver
    summarize = staticmethod(summarize_response)

    def _translated(self, ask: Ask) -> Upstream:
        chat, names = responses_request.to_chat(ask.parsed)
        doc = ask.parsed.doc
        return _translated(ask, chat, lambda stream: ResponsesWriter(doc, names, stream=stream))


CHAT = ChatDoor()
MESSAGES = MessagesDoor()
RESPONSES = ResponsesDoor()
DOORS: dict[Api, Door] = {Api.CHAT: CHAT, Api.MESSAGES: MESSAGES, Api.RESPONSES: RESPONSES}
