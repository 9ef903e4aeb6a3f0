"""`luftpause dataplane`: the OpenAI-compatible proxy process.

Shell module: options (each also from its `LUFTPAUSE_*` variable, see `common.envargs`) and
logging; `common.runner` gives the uvloop event loop and signals.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import Mapping, Sequence

from luftpause.common import envargs, tracing
from luftpause.common.auth import TOKEN_ENV, token_from_env
from luftpause.common.config import Config, ConfigError, EndpointKind, load_config
from luftpause.common.keys import KeysError, KeysFile
from luftpause.common.logs import setup_logging
from luftpause.common.runner import run_async
from luftpause.dataplane.apis import apis_of
from luftpause.dataplane.app import build_app, start_server
from luftpause.dataplane.context import DEFAULT_MAX_BODY_BYTES, RATE_LIMIT_WAIT_S, Served
from luftpause.dataplane.workers import Supervisor

# The names these options were read from before every option had its own variable.
ENV_ALIASES = {"LUFTPAUSE_PORT": ("LUFTPAUSE_DATAPLANE_PORT",)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="luftpause dataplane", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on")
    parser.add_argument(
        "--scheduler",
        metavar="HOST:PORT",
        default="127.0.0.1:5000",
        help="the scheduler's gRPC address",
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="endpoint file: engine API keys by replica id, the APIs each engine serves, and "
        "the models `GET /v1/models` lists while the scheduler cannot be reached",
    )
    parser.add_argument(
        "--id",
        dest="dataplane_id",
        default=f"{socket.gethostname()}-{os.getpid()}",
        help="this dataplane's id at the scheduler",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="largest request body"
    )
    parser.add_argument(
        "--no-local-placement",
        dest="local_placement",
        action="store_false",
        help="ask the scheduler for every turn, even when a replica is open (uncapped); "
        "for deployments that spread one run's turns across several dataplanes",
    )
    parser.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="dataplane processes sharing the port (SO_REUSEPORT), each with its own session "
        "to the scheduler: one per core to use (default 1)",
    )
    parser.add_argument(
        "--rate-limit-wait-s",
        type=_seconds,
        default=RATE_LIMIT_WAIT_S,
        help="how long, in all, a turn an engine refused with 429 waits (its Retry-After, or "
        "its rate-limit reset) to be sent again before the 429 goes to the client; 0 sends "
        f"every 429 on at once (default {RATE_LIMIT_WAIT_S:g})",
    )
    parser.add_argument(
        "--keys-file",
        metavar="PATH",
        help="keys per caller (YAML or TOML, see docs/configuration.md): each client then needs "
        "one of its keys (or LUFTPAUSE_TOKEN), which names its caller, classes and budget; "
        "reloaded when it changes",
    )
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    return parser


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError("must be between 0 and 3600 seconds")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Options from argv, each defaulting from its `LUFTPAUSE_*` variable."""
    env = os.environ if environ is None else environ
    return envargs.parse_args(build_parser(), argv, env, aliases=ENV_ALIASES)


def engine_keys(config: Config, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Replica id -> API key, for the replicas whose key variable is set."""
    return {e.id: key for e in config.endpoints if (key := e.api_key(environ))}


def served(config: Config) -> dict[str, Served]:
    """Replica id -> the APIs it serves and where its key goes, for the generative ones."""
    return {
        e.id: Served(apis=apis_of(e.apis), key_header=e.key_header, url=e.base_url, models=e.models)
        for e in config.endpoints
        if e.kind is EndpointKind.GENERATIVE
    }


def limit_headers(config: Config) -> dict[str, Mapping[str, str]]:
    """Replica id -> its provider's names for the rate-limit headers (`limits.headers`)."""
    return {e.id: e.limits.headers for e in config.endpoints if e.limits and e.limits.headers}


async def serve(
    args: argparse.Namespace,
    api_keys: Mapping[str, str],
    stop: asyncio.Event,
    environ: Mapping[str, str] | None = None,
    config_models: Sequence[str] | None = None,
    keys: KeysFile | None = None,
    renamed: Mapping[str, Mapping[str, str]] | None = None,
    replicas: Mapping[str, Served] | None = None,
) -> None:
    """Run the dataplane until `stop` is set."""
    log = setup_logging("dataplane")
    token = token_from_env(os.environ if environ is None else environ)
    if token is None and keys is None:
        log.warning(f"auth is off: {TOKEN_ENV} is not set, every client is accepted")
    app = build_app(
        scheduler=args.scheduler,
        dataplane_id=args.dataplane_id,
        api_keys=api_keys,
        max_body_bytes=args.max_body_bytes,
        token=token,
        keys=keys,
        local_placement=args.local_placement,
        config_models=config_models,
        rate_limit_wait_s=args.rate_limit_wait_s,
        limit_headers=renamed,
        served=replicas,
    )
    runner, port = await start_server(app, args.host, args.port, reuse_port=args.reuse_port)
    log.info(
        "dataplane listening",
        host=args.host,
        port=port,
        scheduler=args.scheduler,
        dataplane_id=args.dataplane_id,
        engine_keys=sorted(api_keys),
        auth=token is not None or keys is not None,
        keys_file=None if keys is None else str(keys.path),
        local_placement=args.local_placement,
    )
    try:
        await stop.wait()
    finally:
        log.info("dataplane stopping")
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Entry point for `luftpause dataplane`."""
    argv = sys.argv[1:] if argv is None else argv  # as the console script calls it
    args = parse_args(argv)
    try:  # checked here, so a bad file stops the supervisor of --workers too
        keys = KeysFile(args.keys_file) if args.keys_file else None
    except KeysError as exc:
        print(f"luftpause dataplane: {exc}", file=sys.stderr)
        return 2
    if args.workers > 1:
        if args.port == 0:
            print("luftpause dataplane: --workers needs a fixed --port", file=sys.stderr)
            return 2
        return asyncio.run(Supervisor(argv, args.dataplane_id, args.workers).run())
    api_keys: dict[str, str] = {}
    renamed: dict[str, Mapping[str, str]] = {}
    replicas: dict[str, Served] = {}
    models: tuple[str, ...] | None = None
    if args.config:
        try:
            config = load_config(args.config)
        except ConfigError as exc:
            print(f"luftpause dataplane: {exc}", file=sys.stderr)
            return 2
        api_keys = engine_keys(config)
        renamed = limit_headers(config)
        replicas = served(config)
        models = config.generative_models()
    tracing.setup("dataplane", instance=args.dataplane_id)
    return run_async(
        lambda stop: serve(
            args,
            api_keys,
            stop,
            config_models=models,
            keys=keys,
            renamed=renamed,
            replicas=replicas,
        ),
        name="dataplane",
    )
