"""The floor for any Python proxy on this machine: a bare aiohttp pass-through.

Run: `.venv/bin/python -m bench.passthrough --port P --upstream http://127.0.0.1:E`.
One arm of `bench.overhead`, not a product: every POST is sent to the same path upstream on a
kept-alive connection (TCP_NODELAY, as the dataplane's), and the reply's status, content type
and bytes come back as they arrive. No run table, no scheduler, no observing the reply. What
the dataplane adds on top of this arm is what luftpause itself costs; what this arm adds over
going direct is what a Python hop costs here.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import uvloop
from aiohttp import web

from luftpause.dataplane.transport import nodelay_socket


async def serve(port: int, upstream: str) -> None:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, socket_factory=nodelay_socket)
    session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with session.post(upstream + request.path, data=body, headers=headers) as up:
            out = web.StreamResponse(status=up.status)
            out.content_type = up.content_type
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    app = web.Application()
    app.router.add_post("/{tail:.*}", forward)
    app.router.add_get("/health", lambda _: asyncio.sleep(0, web.Response(text="ok")))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await asyncio.Event().wait()
    finally:
        await session.close()
        await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    args = p.parse_args()
    uvloop.run(serve(args.port, args.upstream.rstrip("/")))


if __name__ == "__main__":
    main()
