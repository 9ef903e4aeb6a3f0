"""A local stack on free loopback ports for tests and benchmarks: engines, scheduler, dataplane.

Shell module. Every process is a real `luftpause <subcommand>` child; the caller's
AsyncExitStack stops them all (by PID) when it closes.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.status import wait_for_status

SIM_MODEL = "luftpause-sim"


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
    engine_ports: list[int] = field(default_factory=list)
    grpc_port: int = 0
    http_port: int = 0
    dataplane_port: int = 0
    procs: dict[str, Proc] = field(default_factory=dict)

    async def start(self, stack: AsyncExitStack) -> LocalStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.engine_ports = [free_port() for _ in range(self.engines)]
        lines = ["endpoints:"]
        for i, port in enumerate(self.engine_ports):
            eid = f"engine-{i}"
            lines += [
                f"  - id: {eid}",
                f"    url: http://127.0.0.1:{port}",
                f"    models: [{SIM_MODEL}]",
            ]
            if self.priority is not None:
                interactive, batch = self.priority
                preempts = ", preemptive: true" if self.preemptive else ""
                lines.append(
                    f"    priority: {{interactive: {interactive}, batch: {batch}{preempts}}}"
                )
            if self.slots:
                lines.append(f"    slots: {self.slots}")
            if self.slot_saves:
                lines.append(f"    slot_saves: {self.slot_saves}")
            await self._spawn(
                stack,
                eid,
                [
                    "fake-engine",
                    "--port",
                    str(port),
                    "--id",
                    eid,
                    "--model",
                    SIM_MODEL,
                    *self.engine_args,
                ],
                f"http://127.0.0.1:{port}/health",
            )
        config = self.workdir / "endpoints.yaml"
        config.write_text("\n".join(lines) + "\n")
        self.grpc_port, self.http_port = free_port(), free_port()
        await self._spawn(
            stack,
            "scheduler",
            [
                "scheduler",
                "--config",
                str(config),
                "--grpc-port",
                str(self.grpc_port),
                "--http-port",
                str(self.http_port),
            ],
            f"http://127.0.0.1:{self.http_port}/health",
        )
        if self.with_dataplane:
            self.dataplane_port = free_port()
            await self._spawn(
                stack,
                "dataplane",
                [
                    "dataplane",
                    "--port",
                    str(self.dataplane_port),
                    "--scheduler",
                    f"127.0.0.1:{self.grpc_port}",
                    "--config",
                    str(config),
                ],
                f"http://127.0.0.1:{self.dataplane_port}/health",
            )
        return self

    async def _spawn(self, stack: AsyncExitStack, name: str, args: list[str], ready: str) -> None:
        proc = await Proc(args, name=name, log_path=self.workdir / f"{name}.log").start()
        stack.push_async_callback(proc.stop)
        await proc.wait_http(ready)
        self.procs[name] = proc

    @property
    def base_url(self) -> str:
        """The dataplane's OpenAI base URL."""
        return f"http://127.0.0.1:{self.dataplane_port}/v1"

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/status"

    def engine_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.engine_ports[index]}"

    async def wait_healthy(self, timeout: float = 20.0) -> None:
        """Until the scheduler has seen every engine healthy."""
        await wait_for_status(
            self.status_url, lambda st: all(r["healthy"] for r in st["replicas"]), timeout
        )


@dataclass(frozen=True)
class RuntimeStack:
    """fake-mcp and an MCP runtime in front of a dataplane (or anything OpenAI-compatible)."""

    mcp_url: str
    status_url: str
    runtime: Proc
    fake_mcp: Proc


async def start_runtime(
    exits: AsyncExitStack,
    workdir: Path,
    dataplane: str,
    *,
    name: str = "runtime",
    tool_seconds: float = 0.05,
    model: str | None = None,
) -> RuntimeStack:
    """fake-mcp with both tools fixed at `tool_seconds`, and a runtime whose turns go to
    `dataplane` (a base URL without /v1); both stopped when `exits` closes.
    """
    mcp_port, port = free_port(), free_port()
    latency = str(tool_seconds)
    fake = await Proc(
        [
            "fake-mcp",
            "--port",
            str(mcp_port),
            "--lookup-latency",
            latency,
            "--deep-search-latency",
            latency,
        ],
        name=f"{name}-fake-mcp",
        log_path=workdir / f"{name}-fake-mcp.log",
    ).start()
    exits.push_async_callback(fake.stop)
    await fake.wait_http(f"http://127.0.0.1:{mcp_port}/health", timeout=60)
    args = [
        "runtime",
        "--port",
        str(port),
        "--state-dir",
        str(workdir / f"{name}-state"),
        "--dataplane",
        dataplane,
        "--mcp-server",
        f"http://127.0.0.1:{mcp_port}/mcp",
    ]
    runtime = await Proc(
        [*args, *(("--model", model) if model else ())],
        name=name,
        log_path=workdir / f"{name}.log",
    ).start()
    exits.push_async_callback(runtime.stop)
    await runtime.wait_http(f"http://127.0.0.1:{port}/status", timeout=60)
    base = f"http://127.0.0.1:{port}"
    return RuntimeStack(
        mcp_url=f"{base}/mcp", status_url=f"{base}/status", runtime=runtime, fake_mcp=fake
    )
