"""`luftpause fake-mcp`: an MCP tool server over Streamable HTTP for sub-agents to call.

Shell module: argv parsing (each option also from its `LUFTPAUSE_*` variable), the `mcp` SDK's
`MCPServer`, uvicorn and signals. What the tools say and how long they take comes from `core`;
deduplication by idempotency key and the ledger file from `dedup`. Serves, on one port:

    POST/GET/DELETE /mcp   the MCP Streamable HTTP endpoint (tools: lookup and deep_search,
                           read-only; delete_record, destructive; charge, neither idempotent
                           nor read-only: each execution charges again; set_status, idempotent)
    GET /stats             {"calls": {tool: n}, "in_flight": {tool: n},
                            "keys": {key: {"tool", "received", "executions", "answered"}}}
    GET /health            200 once the server is listening

`calls` counts executions: a request whose idempotency key was answered before (or is being
answered) is not executed again, but counted under its key as `received`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import structlog
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from luftpause.common import envargs
from luftpause.common.logs import setup_logging
from luftpause.testkit.fakemcp.core import (
    CallStats,
    Latency,
    charge_text,
    deep_search_text,
    lookup_text,
    status_text,
)
from luftpause.testkit.fakemcp.dedup import Dedup, key_of

DEFAULT_LOOKUP_LATENCY = Latency(low=0.5, high=1.5)
DEFAULT_DEEP_SEARCH_LATENCY = Latency(low=2.0, high=4.0)
DEFAULT_WRITE_LATENCY = Latency.fixed(0.0)
_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
_DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
_WRITE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
_IDEMPOTENT = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
_SHUTDOWN_GRACE_SECONDS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeMcpConfig:
    """Everything `luftpause fake-mcp` takes from its command line."""

    host: str = "127.0.0.1"
    port: int = 9100
    lookup_latency: Latency = DEFAULT_LOOKUP_LATENCY
    deep_search_latency: Latency = DEFAULT_DEEP_SEARCH_LATENCY
    write_latency: Latency = DEFAULT_WRITE_LATENCY  # charge and set_status
    seed: int | None = None
    time_scale: float = 1.0
    ledger: Path | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {self.time_scale}")

    def rng(self, tool: str) -> random.Random:
        """One generator per tool, so a tool's latencies do not depend on the other's calls."""
        return random.Random() if self.seed is None else random.Random(f"{self.seed}:{tool}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="luftpause fake-mcp", description="An MCP tool server for tests."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=9100, help="port to listen on")
    parser.add_argument(
        "--lookup-latency",
        type=float,
        metavar="SECONDS",
        help="fixed lookup latency (default: uniform 0.5-1.5 s)",
    )
    parser.add_argument(
        "--deep-search-latency",
        type=float,
        metavar="SECONDS",
        help="fixed deep_search latency (default: uniform 2-4 s)",
    )
    parser.add_argument(
        "--write-latency",
        type=float,
        metavar="SECONDS",
        help="fixed latency of charge and set_status (default 0)",
    )
    parser.add_argument(
        "--ledger",
        metavar="PATH",
        help="a file that keeps every idempotency key's requests, executions and result, "
        "read back on start (default: in memory only)",
    )
    parser.add_argument("--seed", type=int, help="seed for the random latencies")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="F",
        help="divide every latency by F (default 1)",
    )
    return parser


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> FakeMcpConfig:
    """Build the config from argv (the subcommand name already removed) and the environment."""
    parser = build_parser()
    ns = envargs.parse_args(parser, argv, os.environ if environ is None else environ)
    try:
        return FakeMcpConfig(
            host=ns.host,
            port=ns.port,
            lookup_latency=_latency(ns.lookup_latency, DEFAULT_LOOKUP_LATENCY),
            deep_search_latency=_latency(ns.deep_search_latency, DEFAULT_DEEP_SEARCH_LATENCY),
            write_latency=_latency(ns.write_latency, DEFAULT_WRITE_LATENCY),
            seed=ns.seed,
            time_scale=ns.time_scale,
            ledger=Path(ns.ledger) if ns.ledger else None,
        )
    except ValueError as exc:
        parser.error(str(exc))


def _latency(seconds: float | None, default: Latency) -> Latency:
    return default if seconds is None else Latency.fixed(seconds)


def build_server(config: FakeMcpConfig, stats: CallStats, dedup: Dedup | None = None) -> MCPServer:
    """The MCP server with its tools and the `/stats` and `/health` routes."""
    server: MCPServer = MCPServer(
        "luftpause-fake-mcp",
        instructions="Fake tools for tests: lookup, deep_search, delete_record, charge and "
        "set_status.",
    )
    once = Dedup() if dedup is None else dedup
    lookup_rng = config.rng("lookup")
    deep_search_rng = config.rng("deep_search")
    write_rng = config.rng("write")

    async def keyed(
        ctx: Context[Any, Any], tool: str, latency: float, answer: Callable[[int], str]
    ) -> str:
        """The tool's answer, run once per idempotency key (`dedup`), counted in `stats`."""

        async def work(n: int) -> str:
            with _counted(stats, tool):
                await asyncio.sleep(latency)
                return answer(n)

        return await once.run(key_of(ctx.request_context.meta), tool, work)

    @server.tool(annotations=_READ_ONLY, structured_output=False)
    async def lookup(query: str, ctx: Context[Any, Any]) -> str:
        """Look up a short answer to the query."""
        latency = config.lookup_latency.draw(lookup_rng, time_scale=config.time_scale)
        return await keyed(ctx, "lookup", latency, lambda _: lookup_text(query))

    @server.tool(annotations=_READ_ONLY, structured_output=False)
    async def deep_search(
        query: str, ctx: Context[Any, Any], depth: Annotated[int, Field(ge=1, le=5)] = 2
    ) -> str:
        """Search in depth: slower than lookup, and one paragraph per level of depth."""
        latency = config.deep_search_latency.draw(deep_search_rng, time_scale=config.time_scale)
        return await keyed(ctx, "deep_search", latency, lambda _: deep_search_text(query, depth))

    @server.tool(annotations=_DESTRUCTIVE, structured_output=False)
    async def delete_record(record_id: str, ctx: Context[Any, Any]) -> str:
        """Delete a record by id. Destructive: nothing is really deleted, but callers must ask."""
        return await keyed(ctx, "delete_record", 0.0, lambda _: f"deleted {record_id}")

    @server.tool(annotations=_WRITE, structured_output=False)
    async def charge(account: str, cents: int, ctx: Context[Any, Any]) -> str:
        """Charge an account. Not idempotent: every execution charges again (nothing real)."""
        latency = config.write_latency.draw(write_rng, time_scale=config.time_scale)
        return await keyed(ctx, "charge", latency, lambda n: charge_text(account, cents, n))

    @server.tool(annotations=_IDEMPOTENT, structured_output=False)
    async def set_status(ticket: str, status: str, ctx: Context[Any, Any]) -> str:
        """Set a ticket's status. Idempotent: setting the same status twice changes nothing."""
        latency = config.write_latency.draw(write_rng, time_scale=config.time_scale)
        return await keyed(ctx, "set_status", latency, lambda _: status_text(ticket, status))

    @server.custom_route("/stats", methods=["GET"])
    async def stats_route(request: Request) -> Response:
        return JSONResponse(stats.snapshot() | {"keys": once.ledger.snapshot()})

    @server.custom_route("/health", methods=["GET"])
    async def health_route(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return server


@contextlib.contextmanager
def _counted(stats: CallStats, tool: str) -> Iterator[None]:
    stats.started(tool)
    try:
        yield
    finally:
        stats.finished(tool)


class _Uvicorn(uvicorn.Server):
    """A uvicorn server that leaves signal handling to `serve`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn's own handler re-raises the signal after its graceful shutdown, so the
        # process would die of SIGTERM instead of exiting 0.
        yield


async def serve(config: FakeMcpConfig, log: structlog.stdlib.BoundLogger) -> int:
    """Serve until SIGINT or SIGTERM; 0 after a clean shutdown, 1 if startup failed."""
    stats = CallStats()
    dedup = Dedup(config.ledger)
    app = build_server(config, stats, dedup).streamable_http_app(
        streamable_http_path="/mcp", host=config.host
    )
    server = _Uvicorn(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=_SHUTDOWN_GRACE_SECONDS,
        )
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.handle_exit, sig, None)
    log.info("fake_mcp.starting", url=f"http://{config.host}:{config.port}/mcp")
    try:
        await server.serve()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    dedup.close()
    log.info("fake_mcp.stopped", calls=stats.snapshot()["calls"], started=server.started)
    return 0 if server.started else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of `luftpause fake-mcp`."""
    argv = sys.argv[1:] if argv is None else argv  # as the console script calls it
    config = parse_args(argv)
    log = setup_logging("fake-mcp")
    return asyncio.run(serve(config, log))
