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
from luftpause.testkit.stack import (
    SIM_MODEL,
    Dataplane,
    Endpoint,
    Launcher,
    Scheduler,
    write_endpoints,
)
from luftpause.testkit.status import fetch_status
from luftpause.testkit.waits import WAIT_SECONDS, local_url, read_metrics, until_status

RUN = "x-luftpause-run-id"
CAPPED, HOSTED, DOOMED, FLAKY, SILENT = "capped", "hosted", "doomed", "flaky", "silent"
# A 429 is waited out for 5 s in all: the hosted engine's window (3 s) fits, the simulator's
# injected 429s (Retry-After 1, every time) reach the client after a few tries.
RATE_LIMIT_WAIT_S = 5
DATAPLANE_ARGS = ("--rate-limit-wait-s", str(RATE_LIMIT_WAIT_S))
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
    # No budget headers: the scheduler cannot learn the limit, so a 429 happens.
    "hosted": ("--rpm", "1", "--time-scale", "20", "--rate-limit-headers", "none"),
    "doomed": ("--time-scale", "5", "--reply-tokens", "2000", "--default-max-tokens", "2000"),
}
# Probes far apart, so a test that closes an engine's port just after one has seconds to see a
# turn fail before the next probe takes the engine out, however busy the machine; also the probe
# timeout, so no healthy engine is taken out for answering slowly.
PROBE_PERIOD = "5"
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
    scheduler: Scheduler
    dataplane: Dataplane
    session: aiohttp.ClientSession
    killed: set[str] = field(default_factory=set)

    @property
    def chat_url(self) -> str:
        return self.dataplane.base_url + "/chat/completions"

    def client(self, **headers: str) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=self.dataplane.base_url,
            api_key="x",
            max_retries=0,
            timeout=WAIT_SECONDS,
            default_headers=headers,
        )

    async def status(self) -> dict[str, Any]:
        return await fetch_status(self.scheduler.status_url, self.session)

    async def until(
        self, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = WAIT_SECONDS
    ) -> dict[str, Any]:
        """The first status that passes `check`; after `timeout` a failure naming `what`."""
        return await until_status(self.scheduler.status_url, check, what, timeout, self.session)

    async def engine_metrics(self, name: str) -> dict[str, float]:
        return await read_metrics(local_url(self.ports[name]) + "/metrics", self.session)

    async def dataplane_turns(self, outcome: str) -> float:
        """Turns the dataplane counted with `outcome`, over both service classes."""
        m = await read_metrics(self.dataplane.url + "/metrics", self.session)
        return sum(
            v
            for k, v in m.items()
            if k.startswith("luftpause_dataplane_turns_total{") and f'outcome="{outcome}"' in k
        )

    async def dataplane_metric(self, name: str) -> float:
        """A dataplane metric summed over its labels (0 before its first sample)."""
        m = await read_metrics(self.dataplane.url + "/metrics", self.session)
        return m.get(name, 0.0)

    async def requests_total(self) -> float:
        """Chat requests received by every engine still running."""
        names = [n for n in self.engines if n not in self.killed]
        return sum([(await self.engine_metrics(n))["luftpause_sim_requests_total"] for n in names])

    async def settled(self) -> dict[str, Any]:
        """Wait until no turn is in flight, then check that no slot and no run is left held."""
        st = await self.until(
            lambda s: s["turns_in_flight"] == 0 and s["held_total"] == 0,
            "no turn in flight and none held",
        )
        assert [r["id"] for r in st["replicas"] if r["in_flight"]] == []
        assert sum(st["runs"]["generating"].values()) == 0
        assert sum(st["runs"]["tool_paused"].values()) == 0
        return st


@asynccontextmanager
async def failure_stack(work: Path) -> AsyncIterator[Stack]:
    """Every engine of the table, a scheduler and a dataplane, all healthy and connected."""
    async with AsyncExitStack() as exits:
        session = await exits.enter_async_context(aiohttp.ClientSession())
        launcher = Launcher(work, exits)
        ports = {name: free_port() for name in MODELS}
        victim, silent = ProbedEngine("a-victim"), ProbedEngine("a-silent")
        for engine in (victim, silent):
            await engine.start(ports[engine.replica_id])
            exits.push_async_callback(engine.stop)
        await asyncio.gather(
            *(
                launcher.engine(name, *args, models=MODELS[name], port=ports[name])
                for name, args in ENGINE_ARGS.items()
            )
        )
        endpoints = [
            Endpoint(id=name, url=local_url(ports[name]), models=models)
            for name, models in MODELS.items()
        ]
        config = write_endpoints(work / "endpoints.yaml", endpoints)
        scheduler = await launcher.scheduler(config, "--probe-period", PROBE_PERIOD)
        s = Stack(
            engines={name: launcher.procs[name] for name in ENGINE_ARGS},
            ports=ports,
            victim=victim,
            silent=silent,
            scheduler=scheduler,
            dataplane=await launcher.dataplane(scheduler, *DATAPLANE_ARGS),
            session=session,
        )
        await s.until(
            lambda st: (
                all(r["healthy"] for r in st["replicas"])
                and any(d["streams"] for d in st["dataplanes"])
            ),
            "every replica healthy and the dataplane in session",
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
