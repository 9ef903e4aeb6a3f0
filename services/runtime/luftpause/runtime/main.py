"""`luftpause runtime`: argv, the journals (runs.jsonl, tasks.jsonl), the upstream sessions,
the MCP server (with the Tasks extension) under uvicorn.

Shell module. Serves on one port:

    POST/GET/DELETE /mcp   MCP Streamable HTTP (spawn, await, run, status, forecast, cancel,
                           approve, decide, tools)
    GET /status            the run tree with each run's own work and subtree totals
    GET /health            liveness: 200 while the process serves
    GET /ready             readiness: 200 while the dataplane answers its own /ready
    GET /metrics           Prometheus metrics (`metrics`); open like /health
    GET/POST /away         the away switches of the attention budget (`people.question_gate`)

The state dir holds `runs.jsonl` (the runs), `tasks.jsonl` (MCP Tasks) and `attention.jsonl`
(the attention budget's asks and the away switches). With `--journal postgresql://...` the runs
and the tasks are the database's instead (`journal.postgres`), shared by every replica on it
(`fleet`, `leases`); attention stays in the state dir, per replica. Finished runs older than
`--retain-finished` leave the live journal (`retention`), checked every `--retain-every`.

`/status` answers CORS for the origins of `--cors-origin` (`cors`), so the scheduler's status
page can show the run tree.

Every option can also come from its `LUFTPAUSE_*` variable (`common.envargs`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import uvicorn

from luftpause.common import envargs, tracing
from luftpause.common.auth import RUNTIME_KEY_ENV, TOKEN_ENV, Identity, token_from_env
from luftpause.common.keys import KeysError, KeysFile
from luftpause.common.logs import setup_logging
from luftpause.common.runner import run_async
from luftpause.runtime.context import wall
from luftpause.runtime.context.windows import Windows
from luftpause.runtime.core import retention
from luftpause.runtime.core.attention import DEFAULT_PER_HOUR
from luftpause.runtime.core.compaction import DEFAULT_KEEP_ROUNDS, DEFAULT_SUMMARY_TOKENS
from luftpause.runtime.core.price_table import PricesError, PriceTable
from luftpause.runtime.journal import postgres
from luftpause.runtime.journal.file import JournalFile, Store
from luftpause.runtime.journal.fleet import Fleet
from luftpause.runtime.journal.postgres import Database, PgJournal
from luftpause.runtime.loop import failpoints, spans
from luftpause.runtime.loop.llm import TURN_TIMEOUT, Llm
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.loop.upstream import TOOL_TIMEOUT, Upstreams
from luftpause.runtime.people import question_gate
from luftpause.runtime.plans import planner
from luftpause.runtime.plans.planner import load_prices
from luftpause.runtime.server.app import build_server, spawn_owned, spec_from
from luftpause.runtime.server.arguments import spawn_args
from luftpause.runtime.server.auth import BearerAuth
from luftpause.runtime.server.cors import DEFAULT_ORIGINS, StatusCors
from luftpause.runtime.server.metrics import RuntimeMetrics
from luftpause.runtime.server.readiness import DataplaneReadiness, Verdict
from luftpause.runtime.server.tasks import TASKS_NAME, TasksExtension

_SHUTDOWN_GRACE_SECONDS = 2
STOP_GRACE = 5.0  # seconds tool calls in flight get to return when the runtime stops
LEASE_SECONDS = 15.0
RETAIN_FINISHED = 7 * 24 * 3600.0
RETAIN_EVERY = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConfig:
    """Everything `luftpause runtime` takes from its command line."""

    host: str = "127.0.0.1"
    port: int = 7000
    dataplane: str = "http://127.0.0.1:8080"
    mcp_servers: tuple[str, ...] = ()
    mcp_stdio: tuple[str, ...] = ()
    state_dir: Path = Path("state")
    model: str = "luftpause-sim"
    decide_model: str | None = None
    cors_origins: tuple[str, ...] = DEFAULT_ORIGINS
    keys_file: Path | None = None
    approvals_per_hour: int = DEFAULT_PER_HOUR
    # (model or None for every model, tokens), as `--context-window` gives them.
    context_windows: tuple[tuple[str | None, int], ...] = ()
    keep_rounds: int = DEFAULT_KEEP_ROUNDS
    summary_tokens: int = DEFAULT_SUMMARY_TOKENS
    prices_file: Path | None = None
    scheduler_url: str | None = None
    turn_timeout: float = TURN_TIMEOUT
    tool_timeout: float = TOOL_TIMEOUT
    stop_grace: float = STOP_GRACE
    journal: str | None = None  # a postgresql:// URL; None: the file journal in state_dir
    replica: str = ""
    lease_seconds: float = LEASE_SECONDS
    retain_finished: float = RETAIN_FINISHED
    retain_every: float = RETAIN_EVERY

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.turn_timeout <= 0 or self.tool_timeout <= 0:
            raise ValueError("--turn-timeout and --tool-timeout must be above 0 seconds")
        if self.stop_grace < 0:
            raise ValueError("--stop-grace must be at least 0 seconds")
        if self.approvals_per_hour < 0 or self.keep_rounds < 0 or self.summary_tokens < 1:
            raise ValueError("approvals per hour and keep rounds must be >= 0, summary tokens >= 1")
        if self.scheduler_url is not None:
            planner.check_url(self.scheduler_url)
        if self.journal is not None and not postgres.is_url(self.journal):
            raise ValueError(
                "--journal takes a postgresql:// URL (the file journal is the default)"
            )
        if self.lease_seconds <= 0 or self.retain_every <= 0:
            raise ValueError("--lease-seconds and --retain-every must be above 0 seconds")
        if self.retain_finished < 0:
            raise ValueError("--retain-finished must be at least 0 seconds (0 keeps every run)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="luftpause runtime", description="The MCP runtime.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=7000, help="port to listen on")
    p.add_argument("--dataplane", default="http://127.0.0.1:8080", help="dataplane base URL")
    p.add_argument(
        "--mcp-server",
        action="append",
        default=[],
        metavar="URL",
        help="upstream MCP server (Streamable HTTP); repeatable",
    )
    p.add_argument(
        "--mcp-stdio",
        action="append",
        default=[],
        metavar="COMMAND",
        help='upstream MCP server over stdio, as one command line ("cmd arg ..."); repeatable',
    )
    p.add_argument(
        "--state-dir",
        default="state",
        help="where the journals live (runs.jsonl, tasks.jsonl, attention.jsonl)",
    )
    p.add_argument("--model", default="luftpause-sim", help="default model for spawn")
    p.add_argument("--decide-model", help="single-pass model for decide without labels")
    p.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="origin whose pages may read GET /status, e.g. the scheduler's status page "
        f"(default {' and '.join(DEFAULT_ORIGINS)}; * for any); repeatable",
    )
    p.add_argument(
        "--keys-file",
        metavar="PATH",
        help="keys per caller, the dataplane's file: MCP clients then need one of its keys (or "
        f"LUFTPAUSE_TOKEN), and a run's turns count against the key that spawned it, sent with "
        f"{RUNTIME_KEY_ENV} (a key with acts_for) as bearer; reloaded when it changes",
    )
    p.add_argument(
        "--turn-timeout",
        type=float,
        default=TURN_TIMEOUT,
        metavar="SECONDS",
        help="longest a sub-agent's turn may take, all its tries, waits and queueing included "
        f"(default {TURN_TIMEOUT:g})",
    )
    p.add_argument(
        "--tool-timeout",
        type=float,
        default=TOOL_TIMEOUT,
        metavar="SECONDS",
        help="longest wait for a tool call's result, its reconnects and sends again included "
        f"(default {TOOL_TIMEOUT:g})",
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        default=STOP_GRACE,
        metavar="SECONDS",
        help="on SIGTERM, how long tool calls already sent may take to return and be journaled "
        f"before the runtime stops (nothing new starts meanwhile; default {STOP_GRACE:g})",
    )
    p.add_argument(
        "--journal",
        metavar="URL",
        help="postgresql://user:password@host:port/db: the runs and tasks in PostgreSQL, shared "
        "by every replica on it (default: runs.jsonl and tasks.jsonl in --state-dir)",
    )
    p.add_argument(
        "--replica",
        default="",
        help="this replica's name in the database's leases (default: host name and a random "
        "suffix; every process needs its own)",
    )
    p.add_argument(
        "--lease-seconds",
        type=float,
        default=LEASE_SECONDS,
        metavar="SECONDS",
        help="with --journal: how long a replica's runs wait after it stops renewing before "
        f"another replica takes them over (default {LEASE_SECONDS:g})",
    )
    p.add_argument(
        "--retain-finished",
        type=float,
        default=RETAIN_FINISHED,
        metavar="SECONDS",
        help="finished run trees older than this leave the live journal for its archive and "
        f"are no longer answered for (default {RETAIN_FINISHED:g}, a week; 0 keeps every run)",
    )
    p.add_argument(
        "--retain-every",
        type=float,
        default=RETAIN_EVERY,
        metavar="SECONDS",
        help=f"how often finished runs are checked for retention (default {RETAIN_EVERY:g})",
    )
    question_gate.add_arguments(p)
    wall.add_arguments(p)
    planner.add_arguments(p)
    return p


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> RuntimeConfig:
    """Build the config from argv (the subcommand name already removed) and the environment."""
    p = build_parser()
    env = os.environ if environ is None else environ
    ns = envargs.parse_args(p, argv, env, separators={"LUFTPAUSE_MCP_STDIO": "\n"})
    try:
        return RuntimeConfig(
            host=ns.host,
            port=ns.port,
            dataplane=ns.dataplane,
            mcp_servers=tuple(ns.mcp_server),
            mcp_stdio=tuple(ns.mcp_stdio),
            state_dir=Path(ns.state_dir),
            model=ns.model,
            decide_model=ns.decide_model,
            cors_origins=tuple(ns.cors_origin or DEFAULT_ORIGINS),
            keys_file=Path(ns.keys_file) if ns.keys_file else None,
            approvals_per_hour=ns.approvals_per_hour,
            context_windows=tuple(ns.context_window),
            keep_rounds=ns.keep_rounds,
            summary_tokens=ns.summary_tokens,
            prices_file=Path(ns.prices) if ns.prices else None,
            scheduler_url=ns.scheduler_url,
            turn_timeout=ns.turn_timeout,
            tool_timeout=ns.tool_timeout,
            stop_grace=ns.stop_grace,
            journal=ns.journal or None,
            replica=ns.replica or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}",
            lease_seconds=ns.lease_seconds,
            retain_finished=ns.retain_finished,
            retain_every=ns.retain_every,
        )
    except ValueError as exc:
        p.error(str(exc))


class _Uvicorn(uvicorn.Server):
    """A uvicorn server that leaves signal handling to `run_async`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(
    config: RuntimeConfig,
    stop: asyncio.Event,
    log: structlog.stdlib.BoundLogger,
    keys: KeysFile | None = None,
    prices: PriceTable | None = None,
) -> None:
    """Replay the journal, resume runs, serve until `stop` is set, then stop the runs. What it
    opened before serving (the socket, the upstreams, the model client, the journals, the
    database) is closed again if a later step of the start fails."""
    opened = contextlib.AsyncExitStack()
    try:
        # Bind first, so a taken port is an OSError (one clear line from run_async) before anything
        # starts, not uvicorn's sys.exit from inside a task.
        sock = socket.create_server((config.host, config.port))
        opened.callback(sock.close)
        upstreams = Upstreams(list(config.mcp_servers), list(config.mcp_stdio))
        upstreams.start()
        opened.push_async_callback(upstreams.close)
        token = token_from_env(os.environ)
        if token is None and keys is None:
            log.warning(f"auth is off: {TOKEN_ENV} is not set, every MCP client is accepted")
        bearer = token_from_env(os.environ, RUNTIME_KEY_ENV) or token
        if keys is not None and bearer is None:
            log.warning(f"keys without {RUNTIME_KEY_ENV} or {TOKEN_ENV}: turns carry no bearer")
        llm = Llm(
            config.dataplane,
            timeout=config.turn_timeout,
            token=bearer.decode() if bearer else None,
        )
        opened.push_async_callback(llm.close)
        metrics = RuntimeMetrics()
        observe = metrics.journal_append.observe
        failed = metrics.journal_failed
        windows = Windows(llm, config.context_windows)
        plan = planner.Planner(
            prices=prices, scheduler_url=config.scheduler_url, context_windows=windows.of
        )
        opened.push_async_callback(plan.close)
        attention = question_gate.Questions(
            config.approvals_per_hour,
            on_asked=metrics.asked,
            journal_file=JournalFile(
                config.state_dir, question_gate.ATTENTION_NAME, observe=observe, on_failure=failed
            ),
        )
        if attention.journal is not None:
            opened.callback(attention.journal.close)
        attention.resume()
        db: Database | None = None
        runs_journal: Store = JournalFile(config.state_dir, observe=observe, on_failure=failed)
        task_file: Store = JournalFile(
            config.state_dir, TASKS_NAME, observe=observe, on_failure=failed, key=retention.task_of
        )
        if config.journal is not None:
            db = Database(
                config.journal,
                config.replica,
                lease_seconds=config.lease_seconds,
                observe=observe,
                on_failure=failed,
            )
            opened.push_async_callback(db.close)
            log.info("runtime.journal", database=postgres.redacted(config.journal),
                     replica=config.replica)  # fmt: skip
            await db.connect()
            await db.hold_name(wait=2 * config.lease_seconds)
            runs_journal, task_file = PgJournal(db), PgJournal(db, postgres.TASKS)
            await runs_journal.load()
            await task_file.load()
        runtime = Runtime(
            runs_journal,
            llm,
            upstreams,
            metrics=metrics,
            planner=plan,
            questions=attention,
            tool_timeout=config.tool_timeout,
            wall=wall.ContextWall(
                llm,
                windows,
                keep_rounds=config.keep_rounds,
                summary_tokens=config.summary_tokens,
                on_compacted=metrics.compacted,
            ),
        )
        opened.push_async_callback(runtime.stop, config.stop_grace)
        resumed = runtime.resume(drive=db is None)

        async def spawn(args: dict[str, Any], caller: str, identity: Identity) -> str:
            spec = spec_from(spawn_args(args), caller, config.model)
            return await spawn_owned(runtime, spec, identity, keys)

        tasks = TasksExtension(runtime, task_file, spawn, shared=db is not None)
        opened.callback(tasks.close)
        await tasks.resume()
        fleet: Fleet | None = None
        if db is not None:
            assert isinstance(runs_journal, PgJournal) and isinstance(task_file, PgJournal)
            fleet = Fleet(db, runtime, runs_journal, tasks=task_file, observe_task=tasks.observe)
            fleet.start()
            opened.push_async_callback(fleet.close)
        readiness = DataplaneReadiness(config.dataplane)
        opened.push_async_callback(readiness.close)

        async def ready() -> Verdict:
            if db is not None and (down := await db.ping()) is not None:
                return Verdict(ready=False, message=down, at=0.0)
            return await readiness.check()

        server_ = build_server(
            runtime,
            default_model=config.model,
            decide_model=config.decide_model,
            extensions=[tasks],
            readiness=ready,
            keys=keys,
        )
        mcp_app = server_.streamable_http_app(streamable_http_path="/mcp", host=config.host)
        app = StatusCors(BearerAuth(mcp_app, token, keys), config.cors_origins)
        server = _Uvicorn(
            uvicorn.Config(
                spans.TraceHeaders(app) if tracing.enabled() else app,
                host=config.host,
                port=config.port,
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=_SHUTDOWN_GRACE_SECONDS,
            )
        )
    except BaseException:
        await opened.aclose()
        raise
    opened.pop_all()  # serving: the shutdown below closes everything, in its order
    log.info("runtime.starting", url=f"http://{config.host}:{config.port}/mcp", resumed=resumed)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    stopping = asyncio.create_task(stop.wait())
    retaining = asyncio.create_task(_retain(runtime, tasks, config))
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        retaining.cancel()
        server.should_exit = True
        # In-flight await calls are cut by the shutdown; runs are left to resume from the journal.
        await runtime.stop(config.stop_grace)
        if fleet is not None:
            await fleet.close()  # after the runs stopped: their leases go to the other replicas
        if db is not None:
            await db.close()
        await plan.close()
        tasks.close()
        if attention.journal is not None:
            attention.journal.close()
        with contextlib.suppress(Exception):
            await serving
        await upstreams.close()
        await llm.close()
        await readiness.close()
        log.info("runtime.stopped")


async def _retain(runtime: Runtime, tasks: TasksExtension, config: RuntimeConfig) -> None:
    """Retention at start, then every `retain_every` seconds, of runs and then their tasks (a
    failure is logged and tried next time). In the background: serving does not wait for a
    first pass over a long history."""
    while True:
        try:
            await tasks.retain(await runtime.retain(config.retain_finished))
        except Exception as exc:
            log = structlog.get_logger(service="runtime")
            log.warning("runtime.retention_failed", error=repr(exc))
        await asyncio.sleep(config.retain_every)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `luftpause runtime`."""
    argv = sys.argv[1:] if argv is None else argv  # as the console script calls it
    config = parse_args(argv)
    try:
        failpoints.armed()
    except ValueError as exc:
        print(f"luftpause runtime: {exc}", file=sys.stderr)
        return 2
    try:
        keys = KeysFile(config.keys_file) if config.keys_file else None
    except KeysError as exc:
        print(f"luftpause runtime: {exc}", file=sys.stderr)
        return 2
    try:
        prices = load_prices(config.prices_file) if config.prices_file else None
    except PricesError as exc:
        print(f"luftpause runtime: --prices: {exc}", file=sys.stderr)
        return 2
    tracing.setup("runtime")
    log = setup_logging("runtime")
    return run_async(lambda stop: serve(config, stop, log, keys, prices), name="runtime")
