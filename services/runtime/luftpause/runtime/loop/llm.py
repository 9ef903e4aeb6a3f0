"""Model turns through the dataplane with the official `openai` client, and their retries;
decisions through the dataplane's POST /v1/decide.

Shell module (network I/O). A turn's time (`--turn-timeout`, 600 s) is the whole of it: every
try, the waits between them and the queueing at the dataplane. A 429 is retried after its
Retry-After (else 1 s) and any other failure up to 3 times with backoff, while the turn's time
lasts; a wait that would end past it is not begun. Then the last failure is raised as
`TurnError` and the run fails with it. With tracing on, each
request is a `chat` span (`spans`) whose traceparent goes to the dataplane. A run that belongs
to a key of the keys file (`owners`) sends its turns on behalf of that key
(`x-luftpause-on-behalf-of`), with the runtime's own bearer (`LUFTPAUSE_RUNTIME_KEY`, a service
key, else `LUFTPAUSE_TOKEN`).

A prompt the engine refuses as longer than its context window is raised at once, never
retried, as `ContextOverflow` (the run then compacts its history, `wall`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import openai
import structlog
from openai import AsyncOpenAI
from opentelemetry.trace import Span

from luftpause.common import tracing
from luftpause.common.auth import ON_BEHALF_OF_HEADER
from luftpause.runtime.core import compaction
from luftpause.runtime.core.errors import ContextOverflow, TurnError
from luftpause.runtime.core.hygiene import recover_text_calls
from luftpause.runtime.core.machine import RunSpec, ToolCall, TurnCompleted, Usage
from luftpause.runtime.loop import spans

TURN_TIMEOUT = 600.0  # runtime -> dataplane: longest a turn may take, its tries and waits included
DEFAULT_RETRY_AFTER = 1.0
RETRIES = 3
BACKOFF = 0.5

log = structlog.get_logger(service="runtime")


def retry_after(headers: Mapping[str, str] | None) -> float:
    """Seconds from a Retry-After header (seconds form), else the default."""
    raw = (headers or {}).get("retry-after")
    try:
        return max(0.0, float(raw)) if raw is not None else DEFAULT_RETRY_AFTER
    except ValueError:
        return DEFAULT_RETRY_AFTER


def context_overflow(exc: openai.APIError) -> ContextOverflow | None:
    """The engine's `context_length_exceeded` (or its like, `compaction.overflow`), if it is."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    body = exc.body if exc.body is not None else exc.message
    found, window = compaction.overflow(exc.status_code, body)
    message = f"{ContextOverflow.code}: {type(exc).__name__}: {exc}"
    return ContextOverflow(message, window=window) if found else None


class Llm:
    """One OpenAI client for the dataplane, shared by every run."""

    def __init__(
        self, dataplane: str, *, timeout: float = TURN_TIMEOUT, token: str | None = None
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"a turn's timeout must be above 0 s, got {timeout}")
        self.dataplane = dataplane.rstrip("/")
        self.timeout = timeout
        # The runtime's service key, else LUFTPAUSE_TOKEN: the bearer it sends the dataplane.
        self.client = AsyncOpenAI(
            base_url=f"{self.dataplane}/v1",
            api_key=token or "luftpause",
            max_retries=0,
            timeout=timeout,
        )
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        await self.client.close()
        if self._http is not None:
            await self._http.close()

    async def turn(
        self,
        spec: RunSpec,
        messages: tuple[dict[str, Any], ...],
        tools: list[dict[str, Any]],
        *,
        calls: bool = True,
    ) -> TurnCompleted:
        """One model turn, retried as the module docstring says. With `calls` false the tools
        go with `tool_choice: "none"` and the reply's content is the answer, calls or not.
        """
        failures, tries = 0, 0
        deadline = time.monotonic() + self.timeout
        while True:
            started = time.monotonic()
            tries += 1
            try:
                left = _left(deadline, self.timeout, tries)
                if not tracing.enabled():
                    return await self._once(spec, messages, tools, calls, started, left)
                with spans.chat(spec) as span:
                    return await self._once(spec, messages, tools, calls, started, left, span)
            except openai.RateLimitError as exc:
                delay = retry_after(exc.response.headers)
                _wait_fits(deadline, delay, self.timeout, tries, exc)
                log.info("turn.rate_limited", run=spec.handle, retry_in=delay)
                await asyncio.sleep(delay)
            except openai.APIError as exc:
                overflow = context_overflow(exc)
                if overflow is not None:  # the same prompt would fail again: no retry
                    raise overflow from exc
                failures += 1
                message = f"{type(exc).__name__}: {exc}"
                if failures > RETRIES:
                    raise TurnError(message) from exc
                delay = BACKOFF * 2 ** (failures - 1)
                _wait_fits(deadline, delay, self.timeout, tries, exc)
                log.warning("turn.retry", run=spec.handle, failures=failures, error=message)
                await asyncio.sleep(delay)

    async def _once(
        self,
        spec: RunSpec,
        messages: tuple[dict[str, Any], ...],
        tools: list[dict[str, Any]],
        allow_calls: bool,
        started: float,
        timeout: float,
        span: Span | None = None,
    ) -> TurnCompleted:
        extra: dict[str, Any] = {}
        if tools:
            extra["tools"] = tools
            if not allow_calls:
                extra["tool_choice"] = "none"
        if spec.max_tokens:
            extra["max_tokens"] = spec.max_tokens
        headers = {
            "x-luftpause-run-id": spec.handle,
            "x-luftpause-class": spec.service_class,
            "x-luftpause-caller": spec.caller,
        }
        if spec.key:
            headers[ON_BEHALF_OF_HEADER] = spec.key
        reply = await self.client.chat.completions.create(
            model=spec.model,
            messages=list(messages),  # type: ignore[arg-type]
            extra_headers=headers if span is None else spans.chat_headers(span, headers),
            timeout=timeout,
            **extra,
        )
        if not reply.choices:
            raise TurnError("the model returned no choices", retryable=True)
        message = reply.choices[0].message
        calls = tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
            for c in message.tool_calls or []
            if c.type == "function" and allow_calls
        )
        content = message.content
        if not calls and tools and allow_calls:
            names = frozenset(t["function"]["name"] for t in tools)
            text_calls = recover_text_calls(content, names)
            calls = tuple(
                ToolCall(id=f"call_{reply.id}_{i}", name=name, arguments=args)
                for i, (name, args) in enumerate(text_calls)
            )
            if calls:
                content = None
        details = reply.usage.prompt_tokens_details if reply.usage else None
        usage = Usage(
            turns=1,
            prompt_tokens=reply.usage.prompt_tokens if reply.usage else 0,
            cached_prompt_tokens=(details.cached_tokens or 0) if details else 0,
            completion_tokens=reply.usage.completion_tokens if reply.usage else 0,
            turn_seconds=time.monotonic() - started,
        )
        if span is not None:
            spans.chat_reply(span, reply, usage)
        return TurnCompleted(content=content, tool_calls=calls, usage=usage)

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout), headers=self._headers
            )
        return self._http

    async def decide(self, body: dict[str, Any], caller: str, key: str = "") -> dict[str, Any]:
        """POST /v1/decide (on behalf of `key`, if any); its JSON answer, or `TurnError` with
        the dataplane's message.

        A 429 is waited out like a turn's (Retry-After, else 1 s), for as long as the caller.
        """
        url = f"{self.dataplane}/v1/decide"
        headers = {"x-luftpause-caller": caller, **({ON_BEHALF_OF_HEADER: key} if key else {})}
        while True:
            try:
                async with self._session().post(url, json=body, headers=headers) as resp:
                    text = await resp.text()
                    if resp.status == 429:
                        await asyncio.sleep(retry_after(resp.headers))
                        continue
                    doc = _json(text)
                    if resp.status != 200 or not isinstance(doc, dict):
                        raise TurnError(f"decide failed ({resp.status}): {_message(doc, text)}")
                    return doc
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TurnError(f"decide failed: {exc!r}", retryable=True) from exc

    async def forget_run(self, handle: str) -> None:
        """Tell the dataplane the run is over (DELETE /v1/runs/{id}); best effort."""
        try:
            forget = self._session().delete(
                f"{self.dataplane}/v1/runs/{handle}", timeout=aiohttp.ClientTimeout(total=10)
            )
            async with forget as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("run.forget_failed", run=handle, error=repr(exc))


def _left(deadline: float, limit: float, tries: int) -> float:
    """Seconds left of the turn's time; `TurnError` once none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TurnError(f"the turn did not finish within {limit:g} s ({tries - 1} tries)")
    return left


def _wait_fits(deadline: float, delay: float, limit: float, tries: int, exc: Exception) -> None:
    """Raise `TurnError` now if waiting `delay` s for the next try would pass the turn's time."""
    if time.monotonic() + delay >= deadline:
        raise TurnError(
            f"the turn did not finish within {limit:g} s ({tries} tries; the last: "
            f"{type(exc).__name__}: {exc}; a next try after {delay:g} s would be past it)"
        ) from exc


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _message(doc: Any, text: str) -> str:
    """The message of an `{"error": {"message": ...}}` body, else the body's start."""
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        return str(doc["error"].get("message", text[:200]))
    return text[:200]
