"""The prober: reads every replica's health path and `/metrics` each probe period.

`load_targets` is pure (config in, values out; metrics are read by `engine_load`); `Prober`
is the shell that does the HTTP and feeds `ProbeResult` events to the host. A health probe that
fails, answers non-2xx or takes longer than the period marks the replica unhealthy; a replica
whose metrics cannot be read, or that exports none of the known names, is healthy but reports no
load (and so is never capped).

A router replica (`load_from` in the endpoint file) keeps its own health path; its load is the
sum of the loads read from each of its targets, fetched concurrently with its health probe and
with each other, all within the period. A target that fails, times out or exports no known names
is left out of the sum; when no target gives a load, the router reports no load. Probes send
`Authorization: Bearer <key>` when the endpoint's key variable is set; a `load_from` URL (an
engine that is not a replica) gets no key.

An endpoint with engine `slots` (llama.cpp) is also asked once each time it turns healthy how
many slots it has (`GET /props`, `total_slots`); when that differs from the file, the prober
logs a warning: the scheduler would name slots the engine does not have, or leave some unused.
Any other engine with a metrics path is asked, the same way, how many requests it runs at once
(SGLang's `GET /server_info`), unless the endpoint file says (`max_running`); every probe result
carries the answer (see `core.model.next_cap`).

The metric names understood are in `engine_load`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from luftpause.common.config import Endpoint
from luftpause.scheduler.core.events import ProbeResult
from luftpause.scheduler.engine_load import Load, engine_max_running, parse_load, sum_loads
from luftpause.scheduler.host import SchedulerHost

log = structlog.get_logger(__name__)

PROBE_PERIOD_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadTarget:
    """One metrics URL a replica's load is read from, the key variable to send there, and the
    base URL of the engine it belongs to (where its /server_info is)."""

    url: str
    api_key_env: str = ""
    base: str = ""


def load_targets(endpoint: Endpoint, by_id: Mapping[str, Endpoint]) -> tuple[LoadTarget, ...]:
    """Where `endpoint`'s load is read: its own metrics path, or each of its `load_from`."""
    if not endpoint.load_from:
        if not endpoint.metrics:
            return ()
        return (
            LoadTarget(
                url=endpoint.base_url + endpoint.metrics,
                api_key_env=endpoint.api_key_env,
                base=endpoint.base_url,
            ),
        )
    targets = []
    for entry in endpoint.load_from:
        other = by_id.get(entry)
        if other is None:
            base = entry.rstrip("/")
            targets.append(LoadTarget(url=base + "/metrics", base=base))
        elif other.metrics:
            targets.append(
                LoadTarget(
                    url=other.base_url + other.metrics,
                    api_key_env=other.api_key_env,
                    base=other.base_url,
                )
            )
    return tuple(targets)


def engine_slots(props: object) -> int | None:
    """The slot count llama.cpp's `/props` reports (`total_slots`), or None."""
    if not isinstance(props, dict):
        return None
    n = props.get("total_slots")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


# Anthropic's API answers no request, a probe included, without a version header.
_ANTHROPIC_VERSION = {"anthropic-version": "2023-06-01"}


def _auth(api_key_env: str, key_header: str = "authorization") -> dict[str, str]:
    """The endpoint's key as a bearer, or as Anthropic's API wants it (`key_header`)."""
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    if key_header == "x-api-key":
        return {**_ANTHROPIC_VERSION, **({"x-api-key": key} if key else {})}
    return {"Authorization": f"Bearer {key}"} if key else {}


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
        by_id = {e.id: e for e in endpoints}
        self._targets = {e.id: load_targets(e, by_id) for e in endpoints}
        self._session: aiohttp.ClientSession | None = None
        # Endpoints whose engine was asked what it is (slots, most requests it runs) since they
        # last turned healthy, and the most requests each engine said it runs at once.
        self._engines_read: set[str] = set()
        self._max_running: dict[str, int] = {}
        self._checks: set[asyncio.Task[None]] = set()
        # Set once the first round of probes is applied: the scheduler's readiness.
        self.probed = asyncio.Event()

    async def probe(self, endpoint: Endpoint) -> ProbeResult:
        """One probe of one endpoint: health and load read concurrently, bounded by the period."""
        healthy, load = await asyncio.gather(
            self._healthy(endpoint),
            self._load(self._targets.get(endpoint.id, ()), endpoint.id),
        )
        if not healthy:
            load = None
        return ProbeResult(
            at=self.host.now(),
            replica_id=endpoint.id,
            healthy=healthy,
            running=load.running if load else None,
            waiting=load.waiting if load else None,
            kv_total=load.kv_total if load else None,
            kv_used=load.kv_used if load else None,
            max_running=self._max_running.get(endpoint.id),
        )

    async def _healthy(self, endpoint: Endpoint) -> bool:
        assert self._session is not None
        try:
            async with asyncio.timeout(self.period):
                async with self._session.get(
                    endpoint.base_url + endpoint.health,
                    headers=_auth(endpoint.api_key_env, endpoint.key_header),
                ) as resp:
                    await resp.read()
                    if 200 <= resp.status < 300:
                        return True
                    log.debug("probe failed", replica=endpoint.id, status=resp.status)
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.debug("probe failed", replica=endpoint.id, error=str(exc) or type(exc).__name__)
        return False

    async def _load(self, targets: tuple[LoadTarget, ...], replica_id: str) -> Load | None:
        loads = await asyncio.gather(*(self._read_load(t, replica_id) for t in targets))
        return sum_loads(loads)

    async def _read_load(self, target: LoadTarget, replica_id: str) -> Load | None:
        assert self._session is not None
        try:
            async with asyncio.timeout(self.period):
                async with self._session.get(target.url, headers=_auth(target.api_key_env)) as resp:
                    if resp.status != 200:
                        return None
                    return parse_load(await resp.text())
        except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError) as exc:
            log.debug(
                "metrics unreadable",
                replica=replica_id,
                url=target.url,
                error=str(exc) or type(exc).__name__,
            )
            return None

    async def probe_all(self) -> None:
        results = await asyncio.gather(*(self.probe(e) for e in self.endpoints))
        for endpoint, result in zip(self.endpoints, results, strict=True):
            before = self.host.state.replicas.get(result.replica_id)
            if before is not None and before.healthy != result.healthy:
                log.info(
                    "replica health changed", replica=result.replica_id, healthy=result.healthy
                )
            self.host.apply(result)
            if not result.healthy:
                self._engines_read.discard(endpoint.id)
            elif endpoint.id not in self._engines_read:
                self._engines_read.add(endpoint.id)  # an engine restart may change its figures
                check = self._engine_check(endpoint)
                if check is not None:
                    task = asyncio.create_task(check)
                    self._checks.add(task)
                    task.add_done_callback(self._checks.discard)

    def _engine_check(self, endpoint: Endpoint) -> Coroutine[Any, Any, None] | None:
        """What to ask an engine that turned healthy: llama.cpp its slots, SGLang how many
        requests it runs at once (unless the endpoint file says)."""
        if endpoint.slots:
            return self.check_slots(endpoint)
        if not endpoint.max_running and self._targets.get(endpoint.id):
            return self.read_max_running(endpoint)
        return None

    async def read_max_running(self, endpoint: Endpoint) -> None:
        """Read the most requests the engine runs at once from SGLang's `/server_info`; for a
        router, the sum over the engines its load is read from (unknown if one does not say)."""
        targets = self._targets.get(endpoint.id, ())
        bodies = await asyncio.gather(
            *(self._get_json(endpoint, "/server_info", target) for target in targets)
        )
        counts = [engine_max_running(body) for body in bodies]
        most = None if None in counts else sum(c for c in counts if c is not None)
        if not most:
            self._max_running.pop(endpoint.id, None)
            log.debug("engine reports no request limit", replica=endpoint.id)
            return
        self._max_running[endpoint.id] = most
        log.info("engine request limit", replica=endpoint.id, max_running=most)

    async def _get_json(
        self, endpoint: Endpoint, path: str, target: LoadTarget | None = None
    ) -> object:
        """The JSON body of `path` on the endpoint (or on one of its load targets), or None
        when it cannot be read."""
        assert self._session is not None
        base, key = (target.base, target.api_key_env) if target else (endpoint.base_url, "")
        key = key if target else endpoint.api_key_env
        try:
            async with asyncio.timeout(self.period):
                async with self._session.get(base + path, headers=_auth(key)) as resp:
                    return await resp.json(content_type=None) if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.debug(
                "engine path unreadable",
                replica=endpoint.id,
                path=path,
                error=str(exc) or type(exc).__name__,
            )
            return None

    async def check_slots(self, endpoint: Endpoint) -> None:
        """Warn when the engine's slot count (llama.cpp `/props`) is not the endpoint's."""
        engine = engine_slots(await self._get_json(endpoint, "/props"))
        if engine is None:
            log.info("engine reports no slot count", replica=endpoint.id, slots=endpoint.slots)
        elif engine != endpoint.slots:
            log.warning(
                "engine slots differ from the endpoint file",
                replica=endpoint.id,
                configured=endpoint.slots,
                engine=engine,
            )

    async def run(self) -> None:
        """Probe at once, then every period, until cancelled; `probed` is set after the first
        round."""
        timeout = aiohttp.ClientTimeout(total=self.period, connect=self.period)
        async with aiohttp.ClientSession(timeout=timeout) as self._session:
            try:
                while True:
                    started = asyncio.get_running_loop().time()
                    await self.probe_all()
                    self.probed.set()
                    elapsed = asyncio.get_running_loop().time() - started
                    await asyncio.sleep(max(self.period - elapsed, 0.0))
            finally:
                for task in self._checks:
                    task.cancel()
