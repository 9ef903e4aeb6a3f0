"""The simulator's Messages and Responses APIs: an engine that serves them itself.

Shell layer. vLLM serves `/v1/messages` and `/v1/responses` besides Chat Completions; so does
the simulator, so that the dataplane can pass a turn of either API to it unchanged (the endpoint
file's `apis`) or translate it to Chat Completions, against the same engine. A request of either
API is read and turned into a chat request by the dataplane's own translation
(`luftpause.dataplane.messages`, `.responses`), answered by the simulator's chat path (its
queue, batch, prefix cache, script), and its reply is written back in the API it came in, chunk
by chunk as the chat reply streams (`TranslatedResponse`). A malformed request gets 400 in that
API's error shape. `/v1/messages/count_tokens` counts the prompt's tokens as the simulator
renders and tokenises it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from luftpause.dataplane.chatstream import Translation, Writer, translate_body
from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.messages import request as messages_request
from luftpause.dataplane.messages.reply import MessagesWriter
from luftpause.dataplane.responses import request as responses_request
from luftpause.dataplane.responses.reply import ResponsesWriter
from luftpause.testkit.engine.parsing import HttpError
from luftpause.testkit.engine.tokens import render_prompt, tokenize


class NativeReply:
    """How a chat reply is written back in another API: streamed or whole."""

    def __init__(self, writer: Callable[[bool], Writer]) -> None:
        self._writer = writer

    def response(self, headers: Mapping[str, str]) -> web.StreamResponse:
        """The stream response the chat path writes its SSE frames to."""
        return TranslatedResponse(Translation(self._writer(True)), headers)

    def whole(self, completion: Mapping[str, Any]) -> dict[str, Any]:
        """A whole chat completion as the other API's reply."""
        body, _ = translate_body(json.dumps(completion).encode(), self._writer(False))
        return dict(json.loads(body))


# The chat path's entry (`server.answer_chat`): the request, the chat body, and how to write the
# reply when it came in by another API.
ChatAnswer = Callable[
    [web.Request, dict[str, Any], NativeReply | None], Awaitable[web.StreamResponse]
]


class TranslatedResponse(web.StreamResponse):
    """A stream response that writes chat SSE frames as another API's events."""

    def __init__(self, translation: Translation, headers: Mapping[str, str]) -> None:
        super().__init__(headers=headers)
        self._translation = translation

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        out = self._translation.feed(bytes(data))
        if out:
            await super().write(out)

    async def write_eof(self, data: bytes = b"") -> None:
        tail = self._translation.flush()
        if tail:
            await super().write(tail)
        await super().write_eof(data)


def _bad(exc: BadRequest) -> HttpError:
    return HttpError(exc.status, exc.message)


def messages(answer: ChatAnswer) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`POST /v1/messages` through the chat path."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            asked = messages_request.read_request(await request.read())
            chat = messages_request.to_chat(asked)
        except BadRequest as exc:
            raise _bad(exc) from None
        model = asked.model
        return await answer(request, chat, NativeReply(lambda s: MessagesWriter(model, stream=s)))

    return handle


def responses(answer: ChatAnswer) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`POST /v1/responses` through the chat path."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            asked = responses_request.read_request(await request.read())
            chat, names = responses_request.to_chat(asked)
        except BadRequest as exc:
            raise _bad(exc) from None
        doc = asked.doc
        reply = NativeReply(lambda s: ResponsesWriter(doc, names, stream=s))
        return await answer(request, chat, reply)

    return handle


async def count_tokens(request: web.Request) -> web.StreamResponse:
    """`POST /v1/messages/count_tokens`: the prompt's tokens as the simulator counts them."""
    try:
        asked = messages_request.read_request(await request.read(), counting=True)
        chat = messages_request.to_chat(asked)
    except BadRequest as exc:
        raise _bad(exc) from None
    tokens = tokenize(render_prompt(chat["messages"], chat.get("tools")))
    return web.json_response({"input_tokens": len(tokens)})
