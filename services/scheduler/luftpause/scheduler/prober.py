"""The prober: reads every replica's health path and `/metrics` each probe period.

`parse_load` is pure (text in, numbers out); `Prober` is the shell that does the HTTP and feeds
`ProbeResult` events to the host. A probe that fails or takes longer than the period marks the
replica unhealthy; a replica whose metrics cannot be read, or that exports none of the known
names, is healthy but reports no load (and so is never capped).

Engine metric names understood (running, waiting), first match wins:
  SGLang     sglang:num_running_reqs      sglang:num_queue_reqs
  vLLM       vllm:num_requests_running    vllm:num_requests_waiting
  llama.cpp  llamacpp:requests_processing llamacpp:requests_deferred
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import aiohttp
import structlog

from luftpause.common.config import Endpoint
from luftpause.scheduler.core.model import ProbeResult
from luftpause.scheduler.host import SchedulerHost

log = structlog.get_logger(__name__)

PROBE_PERIOD_S = 2.0

LOAD_NAMES: tuple[tuple[str, str], ...] = (
    ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    running: int
    waiting: int


def _samples(text: str) -> dict[str, float]:
    """Sum of every sample per metric name (over label sets such as model_name)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end <= 0:
            continue
        name = line[:name_end]
        rest = line[line.rfind("}") + 1 :] if line[name_end] == "{" else line[name_end:]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            sums[name] = sums.get(name, 0.0) + value
    return sums


def parse_load(text: str) -> Load | None:
    """Running and waiting requests from Prometheus text, or None if no known names."""
    sums = _samples(text)
    for running, waiting in LOAD_NAMES:
        if running in sums and waiting in sums:
            return Load(running=int(sums[running]), waiting=int(sums[waiting]))
    return None


class Prober:
    """Probes every endpoint on a fixed period and reports to the host."""

    def __init__(
        self,
        host: SchedulerHost,
        endpoints: tuple[Endpoint, ...],
        *,
        period: float = PROBE_PERIOD_S,
    ) -> None:
        self.host = host
        self.endpoints = endpoints
        self.period = period
        self._session: aiohttp.ClientSession | None = None

    async def probe(self, endpoint: Endpoint) -> ProbeResult:
        """One probe of one endpoint, bounded by the period."""
        assert self._session is not None
        headers = {"Authorization": f"Bearer {key}"} if (key := endpoint.api_key()) else {}
        healthy, load = False, None
        try:
            async with asyncio.timeout(self.period):
                async with self._session.get(
                    endpoint.base_url + endpoint.health, headers=headers
                ) as resp:
                    healthy = 200 <= resp.status < 300
                    await resp.read()
                if healthy and endpoint.metrics:
                    async with self._session.get(
                        endpoint.base_url + endpoint.metrics, headers=headers
                    ) as resp:
                        if resp.status == 200:
                            load = parse_load(await resp.text())
        except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError) as exc:
            if not healthy:
                log.debug("probe failed", replica=endpoint.id, error=str(exc) or type(exc).__name__)
        return ProbeResult(
            at=self.host.now(),
            replica_id=endpoint.id,
            healthy=healthy,
            running=load.running if load else None,
            waiting=load.waiting if load else None,
        )

    async def probe_all(self) -> None:
        results = await asyncio.gather(*(self.probe(e) for e in self.endpoints))
        for result in results:
            before = self.host.state.replicas.get(result.replica_id)
            if before is not None and before.healthy != result.healthy:
                log.info(
                    "replica health changed", replica=result.replica_id, healthy=result.healthy
                )
            self.host.apply(result)

    async def run(self) -> None:
        """Probe at once, then every period, until cancelled."""
        timeout = aiohttp.ClientTimeout(total=self.period, connect=self.period)
        async with aiohttp.ClientSession(timeout=timeout) as self._session:
            while True:
                started = asyncio.get_running_loop().time()
                await self.probe_all()
                elapsed = asyncio.get_running_loop().time() - started
                await asyncio.sleep(max(self.period - elapsed, 0.0))
