"""Model turns through the dataplane's OpenAI-compatible POST /v1/chat/completions, and their
retries; the models it lists; decisions through its POST /v1/decide.

Shell module (network I/O), one aiohttp session for all of it. A turn is a plain JSON POST read
back as JSON, not a call of the `openai` client: the runtime is the dataplane's busiest client
under a fleet of sub-agents, and the client's request building (a walk over every message of
the history), its pydantic reply and its connection pool (which checks every idle connection
before each request) took four tenths of the runtime's CPU (py-spy, bench.flood_mcp). A turn's
time (`--turn-timeout`, 600 s) is the whole of it: every
try, the waits between them and the queueing at the dataplane. A 429 is retried after its
Retry-After (else 1 s) and any other failure (a connection that failed, a 5xx or other error
status, a reply that is not a chat completion) up to 3 times with backoff, while the turn's time
lasts; a wait that would end past it is not begun. Then the last failure is raised as
`TurnError` and the run fails with it. With tracing on, each
request is a `chat` span (`spans`) whose traceparent goes to the dataplane. A run that belongs
to a key of the keys file (`owners`) sends its turns on behalf of that key
(`x-luftpause-on-behalf-of`), with the runtime's own bearer (`LUFTPAUSE_RUNTIME_KEY`, a service
key, else `LUFTPAUSE_TOKEN`).

A prompt the engine refuses as longer than its context window is raised at once, never
retried, as `ContextOverflow` (the run then compacts its history, `wall`).

With `--send-priority CLASS=N` each turn of a run of that class carries `"priority": N` in its
body, for a runtime whose dataplane is a plain router in front of engines that schedule by it
(SGLang's `--enable-priority-scheduling`). Through luftpause's dataplane leave it unset: the
dataplane sets each turn's engine priority from its endpoint's `priority` numbers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import aiohttp
import structlog
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


class Refused(Exception):
    """The dataplane answered a turn with an error status: `status`, its headers and body."""

    def __init__(self, status: int, headers: Mapping[str, str], text: str) -> None:
        self.status = status
        self.headers = headers
        self.body = _json(text)
        self.text = text
        super().__init__(_message(self.body, text))


class Unreadable(Exception):
    """A 200 whose body is not a chat completion with a choice."""


def context_overflow(exc: Refused) -> ContextOverflow | None:
    """The engine's `context_length_exceeded` (or its like, `compaction.overflow`), if it is."""
    found, window = compaction.overflow(exc.status, exc.body if exc.body is not None else exc.text)
    message = f"{ContextOverflow.code}: {_name(exc)}: {exc}"
    return ContextOverflow(message, window=window) if found else None


class Llm:
    """One HTTP session to the dataplane, shared by every run."""

    def __init__(
        self,
        dataplane: str,
        *,
        timeout: float = TURN_TIMEOUT,
        token: str | None = None,
        priorities: Mapping[str, int] | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"a turn's timeout must be above 0 s, got {timeout}")
        self.dataplane = dataplane.rstrip("/")
        self.timeout = timeout
        # The engine `priority` a turn's body carries, by its run's class (`--send-priority`).
        self.priorities = dict(priorities or {})
        # The runtime's service key, else LUFTPAUSE_TOKEN: the bearer it sends the dataplane.
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
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
            except Refused as exc:
                if exc.status == 429:
                    delay = retry_after(exc.headers)
                    _wait_fits(deadline, delay, self.timeout, tries, exc)
                    log.info("turn.rate_limited", run=spec.handle, retry_in=delay)
                    await asyncio.sleep(delay)
                    continue
                overflow = context_overflow(exc)
                if overflow is not None:  # the same prompt would fail again: no retry
                    raise overflow from exc
                failures = await self._retry(spec, failures, deadline, tries, exc)
            except (aiohttp.ClientError, TimeoutError, Unreadable) as exc:
                failures = await self._retry(spec, failures, deadline, tries, exc)

    async def _retry(
        self, spec: RunSpec, failures: int, deadline: float, tries: int, exc: Exception
    ) -> int:
        """Wait before the next try after a failure (`TurnError` once there is none); the
        failures counted so far."""
        failures += 1
        message = f"{_name(exc)}: {exc}"
        if failures > RETRIES:
            raise TurnError(message) from exc
        delay = BACKOFF * 2 ** (failures - 1)
        _wait_fits(deadline, delay, self.timeout, tries, exc)
        log.warning("turn.retry", run=spec.handle, failures=failures, error=message)
        await asyncio.sleep(delay)
        return failures

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
        if spec.service_class in self.priorities:
            extra["priority"] = self.priorities[spec.service_class]
        headers = {
            "x-luftpause-run-id": spec.handle,
            "x-luftpause-class": spec.service_class,
            "x-luftpause-caller": spec.caller,
        }
        if spec.key:
            headers[ON_BEHALF_OF_HEADER] = spec.key
        body: dict[str, Any] = {"model": spec.model, "messages": messages, **extra}
        if span is not None:
            headers = spans.chat_headers(span, headers)
        reply = await self._post_turn(body, headers, timeout)
        message = reply["choices"][0].get("message") or {}
        calls = tuple(_tool_calls(message, reply.get("id"))) if allow_calls else ()
        content = message.get("content")
        if not isinstance(content, str):
            content = None
        if not calls and tools and allow_calls:
            names = frozenset(t["function"]["name"] for t in tools)
            text_calls = recover_text_calls(content, names)
            calls = tuple(
                ToolCall(id=f"call_{reply.get('id')}_{i}", name=name, arguments=args)
                for i, (name, args) in enumerate(text_calls)
            )
            if calls:
                content = None
        counts = reply.get("usage") or {}
        details = counts.get("prompt_tokens_details") or {}
        usage = Usage(
            turns=1,
            prompt_tokens=_count(counts, "prompt_tokens"),
            cached_prompt_tokens=_count(details, "cached_tokens"),
            completion_tokens=_count(counts, "completion_tokens"),
            turn_seconds=time.monotonic() - started,
        )
        if span is not None:
            spans.chat_reply(span, reply, usage)
        return TurnCompleted(content=content, tool_calls=calls, usage=usage)

    async def _post_turn(
        self, body: dict[str, Any], headers: dict[str, str], timeout: float
    ) -> dict[str, Any]:
        """POST the turn; its reply, a chat completion with at least one choice (`Refused` for
        an error status, `Unreadable` for anything else)."""
        url = f"{self.dataplane}/v1/chat/completions"
        post = self._session().post(
            url,
            data=_dumps(body),
            headers={**headers, "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        )
        async with post as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise Refused(resp.status, resp.headers, text)
        reply = _json(text)
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise Unreadable(f"not a chat completion with a choice: {text[:200]}")
        return reply

    async def models(self) -> list[dict[str, Any]]:
        """The entries of the dataplane's GET /v1/models (`LookupError` when it cannot say)."""
        try:
            get = self._session().get(
                f"{self.dataplane}/v1/models", timeout=aiohttp.ClientTimeout(total=10)
            )
            async with get as resp:
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise LookupError(f"{_name(exc)}: {exc}") from exc
        doc = _json(text)
        data = doc.get("data") if isinstance(doc, dict) else None
        if resp.status != 200 or not isinstance(data, list):
            raise LookupError(f"models not listed ({resp.status}): {_message(doc, text)}")
        return [entry for entry in data if isinstance(entry, dict)]

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            # No cap on connections (aiohttp's default is 100): every run in a turn holds one.
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers=self._headers,
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


def _name(exc: BaseException) -> str:
    """What a failure is called in a run's error: the HTTP status for an error answer."""
    return f"HTTP {exc.status}" if isinstance(exc, Refused) else type(exc).__name__


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _count(doc: Any, key: str) -> int:
    value = doc.get(key) if isinstance(doc, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _tool_calls(message: dict[str, Any], reply_id: Any) -> Iterator[ToolCall]:
    """The function calls of a reply's message, as the runtime runs them; a call the engine
    gave no id gets one as a call recovered from text does."""
    for i, call in enumerate(message.get("tool_calls") or ()):
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            continue
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        arguments = function.get("arguments")
        yield ToolCall(
            id=str(call.get("id") or f"call_{reply_id}_{i}"),
            name=function["name"],
            arguments=arguments if isinstance(arguments, str) and arguments else "{}",
        )
