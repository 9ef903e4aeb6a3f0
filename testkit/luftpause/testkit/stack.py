"""Local stacks on free loopback ports for tests and benchmarks: engines, schedulers,
dataplanes, a runtime.

Shell module. `Launcher` starts each process as a real `luftpause <subcommand>` child, logging
to `<name>.log` in the work directory, and has the caller's AsyncExitStack stop it (by PID) when
it closes; it can start a killed child again with the same command line. The endpoint file is
written from data (`Endpoint`, `write_endpoints`). `LocalStack` is the usual shape built with
them: simulated engines, a scheduler and a dataplane.

Every wait here is bounded and says what it waited for when it runs out (`waits.eventually`);
the bounds are generous, so a busy machine makes a test slower, not red.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.status import Status
from luftpause.testkit.waits import HOST, READY_SECONDS, WAIT_SECONDS, local_url, until_status

SIM_MODEL = "luftpause-sim"


# --- the endpoint file ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """One replica of the endpoint file. `options` are its other keys as the file spells them
    (kind, priority, slots, health, metrics, api_key_env, load_from...), lists not tuples."""

    id: str
    url: str
    models: tuple[str, ...] = (SIM_MODEL,)
    options: Mapping[str, Any] = field(default_factory=dict)

    def entry(self) -> dict[str, Any]:
        return {"id": self.id, "url": self.url, "models": list(self.models), **self.options}


def write_endpoints(path: Path, endpoints: Sequence[Endpoint]) -> Path:
    """The endpoint file at `path` listing `endpoints`, dumped from data."""
    path.write_text(yaml.safe_dump({"endpoints": [e.entry() for e in endpoints]}, sort_keys=False))
    return path


# --- children -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Scheduler:
    """A running scheduler: gRPC for dataplanes, HTTP for /status, /health and /ready."""

    name: str
    grpc_port: int
    http_port: int

    @property
    def address(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def url(self) -> str:
        return local_url(self.http_port)

    @property
    def status_url(self) -> str:
        return self.url + "/status"


@dataclass(frozen=True, slots=True, kw_only=True)
class Dataplane:
    """A running dataplane; `base_url` is its OpenAI base URL."""

    name: str
    port: int

    @property
    def url(self) -> str:
        return local_url(self.port)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Command:
    args: tuple[str, ...]
    ready: str | int
    env: Mapping[str, str] | None


@dataclass
class Launcher:
    """Starts the children of one stack in `workdir`; `exits` stops them when it closes."""

    workdir: Path
    exits: AsyncExitStack
    procs: dict[str, Proc] = field(default_factory=dict)
    _commands: dict[str, _Command] = field(default_factory=dict, repr=False)

    async def spawn(
        self,
        name: str,
        args: Sequence[str],
        ready: str | int,
        env: Mapping[str, str] | None = None,
    ) -> Proc:
        """Child `name` running `luftpause <args>` (with `env` on top of this process's
        environment), once `ready` answers: a URL with a 2xx, a port by accepting a connection.
        """
        self._commands[name] = _Command(args=tuple(args), ready=ready, env=env)
        return await self.respawn(name)

    async def respawn(self, name: str) -> Proc:
        """Child `name` started again with the command line it was first given (once it died or
        was killed), and ready again."""
        command = self._commands[name]
        proc = Proc(
            command.args,
            name=name,
            log_path=self.workdir / f"{name}.log",
            env=None if command.env is None else dict(command.env),
        )
        await proc.start()
        self.exits.push_async_callback(proc.stop)
        self.procs[name] = proc
        if isinstance(command.ready, int):
            await proc.wait_port(command.ready, READY_SECONDS)
        else:
            await proc.wait_http(command.ready, READY_SECONDS)
        return proc

    async def engine(
        self,
        eid: str,
        *args: str,
        models: Sequence[str] = (SIM_MODEL,),
        port: int = 0,
        tls: tuple[Path, Path] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Endpoint:
        """A `fake-engine` child `eid` (on `port` if given) with `args` on top, as an endpoint
        serving `models` with `options`. The simulator answers any model; it lists the first.
        With `tls` (a certificate and its key) it serves https and is ready once it accepts
        connections, since its health check would need the test's CA.
        """
        port = port or free_port()
        argv = ["fake-engine", "--port", str(port), "--id", eid, "--model", models[0], *args]
        url = local_url(port, "https" if tls else "http")
        ready: str | int = url + "/health"
        if tls is not None:
            argv += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
            ready = port
        await self.spawn(eid, argv, ready)
        return Endpoint(id=eid, url=url, models=tuple(models), options=dict(options or {}))

    async def scheduler(
        self,
        config: Path,
        *args: str,
        name: str = "scheduler",
        env: Mapping[str, str] | None = None,
        ready: str = "/health",
    ) -> Scheduler:
        """A scheduler on the endpoint file `config`, with `args` on top, once its `ready`
        path answers (`/ready`: once it has probed the engines)."""
        grpc, http = free_port(), free_port()
        argv = ["scheduler", "--config", str(config), "--grpc-port", str(grpc)]
        argv += ["--http-port", str(http), *args]
        await self.spawn(name, argv, local_url(http) + ready, env)
        return Scheduler(name=name, grpc_port=grpc, http_port=http)

    async def dataplane(
        self,
        scheduler: Scheduler,
        *args: str,
        name: str = "dataplane",
        config: Path | None = None,
        env: Mapping[str, str] | None = None,
        ready: str = "/health",
    ) -> Dataplane:
        """A dataplane of `scheduler`, with `args` on top, once its `ready` path answers
        (`/ready`: once it is in session); `config`, the endpoint file, gives it the endpoints'
        API keys."""
        port = free_port()
        argv = ["dataplane", "--port", str(port), "--scheduler", scheduler.address, *args]
        if config is not None:
            argv += ["--config", str(config)]
        await self.spawn(name, argv, local_url(port) + ready, env)
        return Dataplane(name=name, port=port)


# --- the usual stack ----------------------------------------------------------------------------


@dataclass
class LocalStack:
    """Simulated engines, a scheduler and (optionally) a dataplane on free loopback ports."""

    workdir: Path
    engine_args: tuple[str, ...] = ()
    engines: int = 2
    with_dataplane: bool = True
    # The endpoints' `priority` (interactive, batch): the numbers sent to their engines.
    priority: tuple[int, int] | None = None
    # Whether the endpoints say their engines preempt for priority (`priority.preemptive`).
    preemptive: bool = False
    # The endpoints' `slots`: engine slots the scheduler assigns (0: none).
    slots: int = 0
    # The endpoints' `slot_saves` (needs `slots`; pass the engines `--slot-saves` to answer).
    slot_saves: int = 0
    # More flags for the scheduler (`--probe-period 0.5`) and the dataplane (`--id dp`).
    scheduler_args: tuple[str, ...] = ()
    dataplane_args: tuple[str, ...] = ()
    engine_ports: list[int] = field(default_factory=list)
    grpc_port: int = 0
    http_port: int = 0
    dataplane_port: int = 0
    procs: dict[str, Proc] = field(default_factory=dict)
    _launcher: Launcher | None = field(default=None, repr=False)

    async def start(self, stack: AsyncExitStack) -> LocalStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._launcher = launcher = Launcher(self.workdir, stack, procs=self.procs)
        self.engine_ports = [free_port() for _ in range(self.engines)]
        endpoints = [
            await launcher.engine(
                f"engine-{i}", *self.engine_args, port=port, options=self._options()
            )
            for i, port in enumerate(self.engine_ports)
        ]
        config = write_endpoints(self.workdir / "endpoints.yaml", endpoints)
        scheduler = await launcher.scheduler(config, *self.scheduler_args)
        self.grpc_port, self.http_port = scheduler.grpc_port, scheduler.http_port
        if self.with_dataplane:
            dataplane = await launcher.dataplane(scheduler, *self.dataplane_args, config=config)
            self.dataplane_port = dataplane.port
        return self

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.priority is not None:
            interactive, batch = self.priority
            options["priority"] = {"interactive": interactive, "batch": batch}
            if self.preemptive:
                options["priority"]["preemptive"] = True
        if self.slots:
            options["slots"] = self.slots
        if self.slot_saves:
            options["slot_saves"] = self.slot_saves
        return options

    @property
    def launcher(self) -> Launcher:
        """Starts more children into this stack, or starts one of its own again."""
        assert self._launcher is not None, "the stack is not started"
        return self._launcher

    @property
    def scheduler(self) -> Scheduler:
        return Scheduler(name="scheduler", grpc_port=self.grpc_port, http_port=self.http_port)

    @property
    def base_url(self) -> str:
        """The dataplane's OpenAI base URL."""
        return f"{local_url(self.dataplane_port)}/v1"

    @property
    def status_url(self) -> str:
        return self.scheduler.status_url

    def engine_url(self, index: int) -> str:
        return local_url(self.engine_ports[index])

    async def until(
        self, check: Callable[[Status], bool], what: str, timeout: float = WAIT_SECONDS
    ) -> Status:
        """The first status of this stack's scheduler that passes `check`."""
        return await until_status(self.status_url, check, what, timeout)

    async def wait_healthy(self, timeout: float = WAIT_SECONDS) -> None:
        """Until the scheduler has seen every engine healthy."""
        await self.until(
            lambda st: all(r["healthy"] for r in st["replicas"]),
            "the scheduler to see every engine healthy",
            timeout,
        )


# --- a runtime in front of a dataplane ----------------------------------------------------------


@dataclass(frozen=True)
class RuntimeStack:
    """fake-mcp and an MCP runtime in front of a dataplane (or anything OpenAI-compatible)."""

    mcp_url: str
    status_url: str
    runtime: Proc
    fake_mcp: Proc

    @property
    def url(self) -> str:
        """The runtime's base URL."""
        return self.status_url.removesuffix("/status")


async def start_runtime(
    exits: AsyncExitStack,
    workdir: Path,
    dataplane: str,
    *,
    name: str = "runtime",
    tool_seconds: float = 0.05,
    model: str | None = None,
    env: Mapping[str, str] | None = None,
) -> RuntimeStack:
    """fake-mcp with both tools fixed at `tool_seconds`, and a runtime whose turns go to
    `dataplane` (a base URL without /v1), with `env` on top of this process's environment; both
    stopped when `exits` closes.
    """
    launcher = Launcher(workdir, exits)
    mcp_port, port = free_port(), free_port()
    latency = str(tool_seconds)
    tools = ["--lookup-latency", latency, "--deep-search-latency", latency]
    fake = await launcher.spawn(
        f"{name}-fake-mcp",
        ["fake-mcp", "--port", str(mcp_port), *tools],
        local_url(mcp_port) + "/health",
    )
    args = ["runtime", "--port", str(port), "--state-dir", str(workdir / f"{name}-state")]
    args += ["--dataplane", dataplane, "--mcp-server", local_url(mcp_port) + "/mcp"]
    # /health: a runtime with a token set answers /status only with the bearer.
    runtime = await launcher.spawn(
        name, [*args, *(("--model", model) if model else ())], local_url(port) + "/health", env
    )
    base = local_url(port)
    return RuntimeStack(
        mcp_url=f"{base}/mcp", status_url=f"{base}/status", runtime=runtime, fake_mcp=fake
    )
