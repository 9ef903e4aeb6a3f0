"""`GET /v1/models`, which never fails because the scheduler is not up yet.

Shell module (an aiohttp handler over the link). The list is the scheduler's (`ListModels`).
While the scheduler cannot be reached:

- with an endpoint file (`--config`), the file answers: its generative models, sorted, in the
  same OpenAI list shape; the scheduler gets `FILE_FALLBACK_SECONDS` to answer while no session
  is up, so a client never waits long for a scheduler that is down;
- without one, the request is held as a turn is: asked again every `retry` seconds (the link's
  reconnect pace) until the scheduler answers, for `hold` seconds at most
  (`MODELS_HOLD_SECONDS`), then answered 503 `scheduler unreachable: ...`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiohttp import web

from luftpause.dataplane.context import DATAPLANE, MODELS_HOLD_SECONDS
from luftpause.dataplane.errors import SchedulerUnavailable
from luftpause.dataplane.link import RPC_TIMEOUT_SECONDS, SchedulerLink

FILE_FALLBACK_SECONDS = 1.0


def openai_list(models: Sequence[str]) -> dict[str, object]:
    """OpenAI's `GET /v1/models` body for these ids."""
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "luftpause"} for m in models]
    return {"object": "list", "data": data}


async def models_from(
    link: SchedulerLink,
    fallback: Sequence[str] | None,
    *,
    hold: float = MODELS_HOLD_SECONDS,
    retry: float = 1.0,
) -> list[str]:
    """The scheduler's models, else the file's; without a file, held as the module says."""
    if fallback is not None:
        timeout = RPC_TIMEOUT_SECONDS if link.ready else FILE_FALLBACK_SECONDS
        try:
            return await link.list_models(timeout=timeout)
        except SchedulerUnavailable:
            return list(fallback)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + hold
    while True:
        remaining = deadline - loop.time()
        try:
            return await link.list_models(timeout=max(min(RPC_TIMEOUT_SECONDS, remaining), 0.05))
        except SchedulerUnavailable as exc:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise SchedulerUnavailable(f"scheduler unreachable: {exc.message}") from exc
            await asyncio.sleep(min(retry, remaining))


async def list_models(request: web.Request) -> web.Response:
    """`GET /v1/models` in OpenAI's list shape."""
    dp = request.app[DATAPLANE]
    models = await models_from(
        dp.link, dp.config_models, hold=dp.models_hold_seconds, retry=dp.models_retry_seconds
    )
    return web.json_response(openai_list(models))
