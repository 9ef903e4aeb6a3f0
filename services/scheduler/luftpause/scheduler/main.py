"""`luftpause scheduler`: gRPC on :5000, HTTP status on :5001, the prober and the clock.

Shell layer: wires the host to its servers and timers and runs until SIGINT/SIGTERM. The
standard gRPC health service answers SERVING for the server as a whole ("") as soon as it
runs (liveness), and for `luftpause.v1.Scheduler` only once the prober has applied its first
round (readiness; NOT_SERVING before, and again while shutting down); HTTP `/health` and
`/ready` say the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping

import grpc
import structlog
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from luftpause.common import envargs, tracing
from luftpause.common.config import ConfigError, load_config
from luftpause.common.logs import setup_logging
from luftpause.common.runner import StartupError, run_async
from luftpause.scheduler import collector
from luftpause.scheduler.core.events import Tick
from luftpause.scheduler.core.model import DATAPLANE_GRACE_S, Rules
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.http import build_app
from luftpause.scheduler.prober import PROBE_PERIOD_S, Prober
from luftpause.scheduler.rpc import SERVICE_NAME, serve_on

CLOCK_TICK_S = 1.0


# The names these options were read from before every option had its own variable.
ENV_ALIASES = {
    "LUFTPAUSE_GRPC_PORT": ("LUFTPAUSE_SCHEDULER_GRPC_PORT",),
    "LUFTPAUSE_HTTP_PORT": ("LUFTPAUSE_SCHEDULER_HTTP_PORT",),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="luftpause scheduler", description=__doc__)
    p.add_argument("--config", default="endpoints.yaml", help="endpoint file (YAML or TOML)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--grpc-port", type=int, default=5000, help="gRPC port")
    p.add_argument("--http-port", type=int, default=5001, help="HTTP status port")
    p.add_argument(
        "--dataplane-grace",
        type=float,
        default=DATAPLANE_GRACE_S,
        help="seconds a dataplane's event streams may be gone before its turns are released",
    )
    names = ", ".join(Rules.names())
    p.add_argument(
        "--without",
        type=_rule_names,
        default=(),
        metavar="RULE[,RULE]",
        help=f"switch placement rules off, as ablations ({names}; see docs/architecture.md)",
    )
    p.add_argument(
        "--with",
        dest="with_rules",
        type=_rule_names,
        default=(),
        metavar="RULE[,RULE]",
        help="switch placement rules on that are off by default (headroom)",
    )
    p.add_argument(
        "--interactive-weight",
        type=_weight,
        default=Rules().interactive_weight,
        metavar="W",
        help="what one interactive run weighs against one batch run where both classes "
        "share a saturated pool: interactive turns go first while their class has had at "
        "most its weighted share lately (the share rule; default %(default)s; "
        "--without share: interactive always first)",
    )
    p.add_argument(
        "--no-affinity",
        action="store_true",
        help="the same as --without affinity,soft_affinity: every run may move",
    )
    p.add_argument(
        "--probe-period",
        type=float,
        default=PROBE_PERIOD_S,
        help="seconds between probes, also the probe timeout (default 2)",
    )
    p.add_argument(
        "--runtime-url",
        default="",
        metavar="URL",
        help="the runtime whose run tree the status page shows, e.g. http://127.0.0.1:7000 "
        "(its /status is read by the browser; the runtime must allow this page's origin)",
    )
    return p


def _rule_names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in Rules.names()]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown rule {unknown[0]!r}; one of {', '.join(Rules.names())}"
        )
    return names


def _weight(text: str) -> float:
    try:
        return Rules(interactive_weight=float(text)).interactive_weight
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a positive number: {text!r} (an interactive run weighs that many batch runs)"
        ) from None


def rules_from(args: argparse.Namespace) -> Rules:
    """The placement rules the options ask for."""
    off = (*args.without, *(("affinity", "soft_affinity") if args.no_affinity else ()))
    rules = Rules(interactive_weight=args.interactive_weight)
    return rules.switched(args.with_rules, on=True).switched(off, on=False)


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Options from argv, each defaulting from its `LUFTPAUSE_*` variable."""
    env = os.environ if environ is None else environ
    parser = build_parser()
    args = envargs.parse_args(parser, argv, env, aliases=ENV_ALIASES)
    if args.runtime_url and not args.runtime_url.startswith(("http://", "https://")):
        parser.error(f"--runtime-url: not an http(s) URL: {args.runtime_url!r}")
    args.runtime_url = args.runtime_url.rstrip("/")
    return args


async def _ticker(host: SchedulerHost) -> None:
    while True:
        await asyncio.sleep(CLOCK_TICK_S)
        host.apply(Tick(at=host.now()))


async def _serving_once_probed(
    prober: Prober, servicer: health.aio.HealthServicer, log: structlog.stdlib.BoundLogger
) -> None:
    await prober.probed.wait()
    await servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    log.info("scheduler ready: engines probed")


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    log = setup_logging("scheduler")
    config = load_config(args.config)
    rules = rules_from(args)
    host = SchedulerHost(config.endpoints, dataplane_grace_s=args.dataplane_grace, rules=rules)
    if rules != Rules():
        log.warning("placement rules changed from the defaults", rules=str(rules))

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    serve_on(server, host)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, reflection.SERVICE_NAME, health.SERVICE_NAME), server
    )
    address = f"{args.host}:{args.grpc_port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as exc:
        raise StartupError(f"cannot listen for gRPC on {address} (port in use?)") from exc
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)

    prober = Prober(host, config.endpoints, period=args.probe_period)
    app = build_app(host, ready=prober.probed.is_set, runtime_url=args.runtime_url)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.http_port).start()
    except OSError:
        await server.stop(grace=None)
        await runner.cleanup()
        raise
    log.info(
        "scheduler listening",
        grpc=f"{args.host}:{args.grpc_port}",
        http=f"{args.host}:{args.http_port}",
        replicas=[e.id for e in config.endpoints],
    )

    tasks = [
        asyncio.create_task(prober.run()),
        asyncio.create_task(_ticker(host)),
        asyncio.create_task(_serving_once_probed(prober, health_servicer, log)),
    ]
    try:
        await stop.wait()
    finally:
        log.info("scheduler stopping")
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace=1.0)
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Run the scheduler until SIGINT or SIGTERM."""
    argv = sys.argv[1:] if argv is None else argv  # as the console script calls it
    args = parse_args(argv)
    try:
        load_config(args.config)
    except ConfigError as exc:
        print(f"luftpause scheduler: {exc}")
        return 2
    tracing.setup("scheduler")
    collector.tune()
    return run_async(
        lambda stop: serve(args, stop), signals=(signal.SIGINT, signal.SIGTERM), name="scheduler"
    )
