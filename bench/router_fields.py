"""What sglang-router forwards of a chat request's body: can its client send the engine a priority?

Run: `.venv/bin/python -m bench.router_fields`. Starts a worker that records every chat request
body it gets, puts sglang-router (cache_aware) in front of it, sends one chat completion with
`priority` (the field SGLang's and vLLM's priority queues read) and an unknown field, and writes
what reached the worker to bench/results/router_fields.json. A router arm whose clients send the
priority (bench.arms CLIENT_PRIORITY) is only a different arm if the field arrives.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
from contextlib import AsyncExitStack
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.arms import _router
from bench.common import write_result
from luftpause.testkit.procs import free_port

SENT: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 4,
    "priority": 7,
    "x_unknown_field": 1,
}


async def worker(bodies: list[dict[str, Any]]) -> tuple[web.AppRunner, str]:
    """A worker that answers like an engine and keeps every chat body it gets."""

    async def chat(request: web.Request) -> web.Response:
        bodies.append(json.loads(await request.read()))
        reply = {"role": "assistant", "content": "ok"}
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def anything(_: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def main_async() -> dict[str, Any]:
    bodies: list[dict[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="bench-router-fields-"))
    async with AsyncExitStack() as exits:
        runner, url = await worker(bodies)
        exits.push_async_callback(runner.cleanup)
        router = await _router(exits, workdir, "cache_aware", [url])
        async with (
            aiohttp.ClientSession() as http,
            asyncio.timeout(30),
            http.post(router + "/v1/chat/completions", json=SENT) as resp,
        ):
            status = resp.status
            await resp.read()
    forwarded = bodies[-1] if bodies else {}
    return {
        "benchmark": "router_fields",
        "router": f"sglang-router {metadata.version('sglang-router')}",
        "sent": SENT,
        "status": status,
        "forwarded": forwarded,
        "priority_forwarded": forwarded.get("priority") == SENT["priority"],
        "unknown_field_forwarded": "x_unknown_field" in forwarded,
    }


def main() -> None:
    # The router tries HTTP/2 on the worker first; aiohttp logs each refusal: not ours to show.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    out = asyncio.run(main_async())
    path = write_result("router_fields", out)
    print(json.dumps({k: out[k] for k in ("router", "priority_forwarded")}), f"wrote {path}")
    sys.exit(0)


if __name__ == "__main__":
    main()
