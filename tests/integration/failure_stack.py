"""The stack the failure-table tests run against: its engines, config and helpers.

See tests/integration/test_failures.py for which engine serves which model and why.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from luftpause.testkit.engine.params import SimParams
from luftpause.testkit.engine.server import make_app
from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import SIM_MODEL
from luftpause.testkit.status import fetch_status, wait_for_status

RUN = "x-luftpause-run-id"
CAPPED, HOSTED, DOOMED, FLAKY, SILENT = "capped", "hosted", "doomed", "flaky", "silent"
MODELS: dict[str, tuple[str, ...]] = {
    "a-victim": (FLAKY,),
    "a-silent": (SILENT,),
    "e0": (SIM_MODEL,),
    "e1": (SIM_MODEL, FLAKY),
    "capped": (CAPPED,),
    "hosted": (HOSTED,),
    "doomed": (DOOMED,),
}
FAST = ("--time-scale", "20", "--reply-tokens", "2000", "--default-max-tokens", "2000")
ENGINE_ARGS: dict[str, tuple[str, ...]] = {
    "e0": FAST,
    "e1": FAST,
    # One request runs, the next queues: the engine reports a queue and the scheduler caps it.
    "capped": ("--max-running", "1", "--reply-tokens", "5000", "--default-max-tokens", "5000"),
    "hosted": ("--rpm", "1", "--time-scale", "20"),
    "doomed": ("--time-scale", "5", "--reply-tokens", "2000", "--default-max-tokens", "2000"),
}
HELLO: list[Any] = [{"role": "user", "content": "hello"}]
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
            },
        },
    }
]


class ProbedEngine:
    """A simulated replica served in this process that notes each health probe it answers."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.app = make_app(SimParams(replica_id=replica_id, time_scale=20.0))
        self.app.on_response_prepare.append(self._prepared)
        self.probed = asyncio.Event()
        self.runner: web.AppRunner | None = None

    async def _prepared(self, request: web.Request, response: web.StreamResponse) -> None:
        if request.path == "/health":
            self.probed.set()

    async def start(self, port: int) -> None:
        self.runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()

    async def stop(self) -> None:
        """Close the port (nothing listens there afterwards) and every connection."""
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()


@dataclass
class Stack:
    engines: dict[str, Proc]
    ports: dict[str, int]
    victim: ProbedEngine
    silent: ProbedEngine
    dataplane_port: int
    status_url: str
    session: aiohttp.ClientSession
    killed: set[str] = field(default_factory=set)

    @property
    def chat_url(self) -> str:
        return f"http://127.0.0.1:{self.dataplane_port}/v1/chat/completions"

    def client(self, **headers: str) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=f"http://127.0.0.1:{self.dataplane_port}/v1",
            api_key="x",
            max_retries=0,
            timeout=30,
            default_headers=headers,
        )

    async def status(self) -> dict[str, Any]:
        return await fetch_status(self.status_url, self.session)

    async def until(
        self, check: Callable[[dict[str, Any]], bool], timeout: float = 15.0
    ) -> dict[str, Any]:
        """The first status that passes `check`, polled within `timeout`."""
        return await wait_for_status(self.status_url, check, timeout, self.session)

    async def replica(self, replica_id: str) -> dict[str, Any]:
        st = await self.status()
        found: dict[str, Any] = next(r for r in st["replicas"] if r["id"] == replica_id)
        return found

    async def engine_metrics(self, name: str) -> dict[str, float]:
        return await self._metrics(f"http://127.0.0.1:{self.ports[name]}/metrics")

    async def dataplane_turns(self, outcome: str) -> float:
        """Turns the dataplane counted with `outcome`, over both service classes."""
        m = await self._metrics(f"http://127.0.0.1:{self.dataplane_port}/metrics")
        return sum(
            v
            for k, v in m.items()
            if k.startswith("luftpause_dataplane_turns_total{") and f'outcome="{outcome}"' in k
        )

    async def requests_total(self) -> float:
        """Chat requests received by every engine still running."""
        names = [n for n in self.engines if n not in self.killed]
        return sum([(await self.engine_metrics(n))["luftpause_sim_requests_total"] for n in names])

    async def settled(self) -> dict[str, Any]:
        """Wait until no turn is in flight, then check that no slot and no run is left held."""
        st = await self.until(lambda s: s["turns_in_flight"] == 0 and s["held_total"] == 0)
        assert [r["id"] for r in st["replicas"] if r["in_flight"]] == []
        assert sum(st["runs"]["generating"].values()) == 0
        assert sum(st["runs"]["tool_paused"].values()) == 0
        return st

    async def _metrics(self, url: str) -> dict[str, float]:
        async with self.session.get(url) as resp:
            text = await resp.text()
        values: dict[str, float] = {}  # by name with labels, and by bare name summed
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                values[key] = float(value)
                if (name := key.split("{")[0]) != key:
                    values[name] = values.get(name, 0.0) + float(value)
        return values


@asynccontextmanager
async def failure_stack(work: Path) -> AsyncIterator[Stack]:
    """Every engine of the table, a scheduler and a dataplane, all healthy and connected."""
    async with AsyncExitStack() as exits:
        session = await exits.enter_async_context(aiohttp.ClientSession())
        ports = {name: free_port() for name in MODELS}

        async def spawn(name: str, args: list[str], ready: str) -> Proc:
            proc = await Proc(args, name=name, log_path=work / f"{name}.log").start()
            exits.push_async_callback(proc.stop)
            await proc.wait_http(ready)
            return proc

        victim, silent = ProbedEngine("a-victim"), ProbedEngine("a-silent")
        for engine in (victim, silent):
            await engine.start(ports[engine.replica_id])
            exits.push_async_callback(engine.stop)
        names = list(ENGINE_ARGS)
        procs = await asyncio.gather(
            *(
                spawn(
                    name,
                    ["fake-engine", "--port", str(ports[name]), "--id", name, *ENGINE_ARGS[name]],
                    f"http://127.0.0.1:{ports[name]}/health",
                )
                for name in names
            )
        )
        lines = ["endpoints:"]
        for name, models in MODELS.items():
            lines += [
                f"  - id: {name}",
                f"    url: http://127.0.0.1:{ports[name]}",
                f"    models: [{', '.join(models)}]",
            ]
        config = work / "endpoints.yaml"
        config.write_text("\n".join(lines) + "\n")
        grpc_port, http_port, dp_port = free_port(), free_port(), free_port()
        sched_args = ["--config", str(config), "--grpc-port", str(grpc_port)]
        await spawn(
            "scheduler",
            ["scheduler", *sched_args, "--http-port", str(http_port)],
            f"http://127.0.0.1:{http_port}/health",
        )
        dp_args = ["--port", str(dp_port), "--scheduler", f"127.0.0.1:{grpc_port}"]
        await spawn("dataplane", ["dataplane", *dp_args], f"http://127.0.0.1:{dp_port}/health")
        s = Stack(
            engines=dict(zip(names, procs, strict=True)),
            ports=ports,
            victim=victim,
            silent=silent,
            dataplane_port=dp_port,
            status_url=f"http://127.0.0.1:{http_port}/status",
            session=session,
        )
        await s.until(
            lambda st: (
                all(r["healthy"] for r in st["replicas"])
                and any(d["streams"] for d in st["dataplanes"])
            ),
            timeout=20,
        )
        yield s


async def sse_until_broken(resp: aiohttp.ClientResponse, then: Callable[[], Any]) -> bytes:
    """Read a stream's raw bytes; after the first chunk, run `then`; return what came."""
    raw = b""
    triggered = False
    with pytest.raises(aiohttp.ClientPayloadError):
        async for chunk in resp.content.iter_any():
            raw += chunk
            if not triggered:
                triggered = True
                await then()
    return raw


@asynccontextmanager
async def black_hole(port: int) -> AsyncIterator[None]:
    """A listener on loopback `port` whose accept queue is full, so a connect there hangs.

    Linux drops a SYN to a listener whose accept queue is full: the connecting side sees a
    host that does not answer, without a packet leaving loopback.
    """
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    socks = [listener]
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(0)
        for _ in range(8):  # fill the queue until a connect hangs
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            socks.append(filler)
            try:
                async with asyncio.timeout(0.3):
                    await loop.sock_connect(filler, ("127.0.0.1", port))
            except TimeoutError:
                break
        else:
            pytest.skip("the listen queue never filled: cannot make a silent host on loopback")
        yield
    finally:
        for sock in socks:
            sock.close()
