"""Each model's context window in tokens, as the runtime knows it.

Shell module (asks the model's OpenAI-compatible `GET /v1/models` through `llm.Llm`, at most every
`LIST_EVERY` seconds). A model's context window is the smallest of what is known about it:

    --context-window MODEL=N   the operator's, for that model; else
    GET /v1/models             `max_model_len` (vLLM, SGLang), `context_length`, or llama.cpp's
                               `meta.n_ctx_train`, from the model's entry (asked at most every
                               `LIST_EVERY` seconds; the dataplane lists ids only, so this
                               answers when the runtime talks to an engine or a proxy that
                               passes them on); else
    --context-window N         the operator's, for every model
    and                        the window an engine named when it refused a prompt
With none known, nothing is compacted before a turn, only after a refusal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import structlog

from luftpause.runtime.core import compaction
from luftpause.runtime.loop.llm import Llm

LIST_EVERY = 300.0
LIST_TIMEOUT = 5.0

log = structlog.get_logger(service="runtime")


def parse_window(text: str) -> tuple[str | None, int]:
    """`--context-window`'s value: `N` (every model) or `MODEL=N`; ValueError when neither."""
    model, sep, number = text.rpartition("=")
    try:
        tokens = int(number)
    except ValueError:
        raise ValueError(f"a context window is N or MODEL=N tokens, got {text!r}") from None
    if tokens < 1 or (sep and not model):
        raise ValueError(f"a context window is N or MODEL=N tokens (N >= 1), got {text!r}")
    return (model if sep else None), tokens


class Windows:
    """Each model's context window, as the module docstring says."""

    def __init__(
        self,
        llm: Llm | None = None,
        configured: Sequence[tuple[str | None, int]] = (),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.llm = llm  # None: never ask /v1/models
        self.per_model = {model: n for model, n in configured if model is not None}
        self.default = next((n for model, n in reversed(configured) if model is None), None)
        self.clock = clock
        self._listed: dict[str, int | None] = {}
        self._listed_at: float | None = None
        self._learned: dict[str, int] = {}

    async def of(self, model: str) -> int | None:
        known = self.per_model.get(model) or await self._listing(model) or self.default
        learned = self._learned.get(model)
        found = [w for w in (known, learned) if w is not None]
        return min(found) if found else None

    def learn(self, model: str, window: int) -> None:
        """An engine refused a prompt naming its window."""
        self._learned[model] = min(window, self._learned.get(model, window))
        log.info("context.window_learned", model=model, window=self._learned[model])

    async def _listing(self, model: str) -> int | None:
        now = self.clock()
        if self.llm is None:
            return None
        if self._listed_at is None or now - self._listed_at >= LIST_EVERY:
            self._listed_at = now
            self._listed = await self._list(self.llm)
        return self._listed.get(model)

    @staticmethod
    async def _list(llm: Llm) -> dict[str, int | None]:
        try:
            async with asyncio.timeout(LIST_TIMEOUT):
                entries = await llm.models()
        except (LookupError, TimeoutError) as exc:
            log.info("context.models_unlisted", error=f"{type(exc).__name__}: {exc}")
            return {}
        return {str(entry.get("id")): compaction.model_window(entry) for entry in entries}
