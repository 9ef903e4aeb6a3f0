"""Prometheus metrics of the scheduler, in its own registry (served on :5001/metrics).

Shell layer. Counters and histograms are updated as actions happen; gauges that describe the
state (per replica: in flight, capacity, engine load, KV pool and resident runs; held turns,
runs by phase) are read from the state at scrape time by a collector, so the hot path pays
nothing for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from luftpause.scheduler.core import shares
from luftpause.scheduler.core.budget_status import budgets_view
from luftpause.scheduler.core.events import Place
from luftpause.scheduler.core.state import State

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300)


class _StateCollector(Collector):
    def __init__(self, metrics: SchedulerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        read = self._metrics.state
        if read is None:
            return
        state = read()
        in_flight = GaugeMetricFamily(
            "luftpause_replica_in_flight_turns",
            "Turns placed on the replica and not finished",
            labels=["replica"],
        )
        capacity = GaugeMetricFamily(
            "luftpause_replica_capacity",
            "Turn cap of the replica (absent while uncapped)",
            labels=["replica"],
        )
        healthy = GaugeMetricFamily(
            "luftpause_replica_healthy", "1 if the last probe passed", labels=["replica"]
        )
        for r in state.replicas.values():
            in_flight.add_metric([r.id], r.in_flight)
            healthy.add_metric([r.id], 1.0 if r.healthy else 0.0)
            if r.capacity is not None:
                capacity.add_metric([r.id], r.capacity)
        yield from (in_flight, capacity, healthy)
        yield from _pool(state)
        held = GaugeMetricFamily(
            "luftpause_held_turns", "Turns waiting for a replica", labels=["class"]
        )
        counts: dict[str, int] = {"interactive": 0, "batch": 0}
        for t in state.held.values():
            counts[str(t.service_class)] += 1
        for cls, n in counts.items():
            held.add_metric([cls], n)
        runs = GaugeMetricFamily(
            "luftpause_runs", "Known runs by phase and class", labels=["phase", "class"]
        )
        by: dict[tuple[str, str], int] = {}
        for run in state.runs.values():
            key = (str(run.phase), str(run.service_class))
            by[key] = by.get(key, 0) + 1
        for (phase, cls), n in sorted(by.items()):
            runs.add_metric([phase, cls], n)
        yield from (held, runs)
        yield from _shares(state, self._metrics.clock())
        yield from _budgets(state, self._metrics.clock())


def _shares(state: State, now: float) -> Iterator[Metric]:
    """Each model pool's split between the classes (see `core.shares`)."""
    part = GaugeMetricFamily(
        "luftpause_interactive_part",
        "Interactive's part of the pool's turn-seconds in flight lately (fading over 60 s)",
        labels=["model"],
    )
    owed = GaugeMetricFamily(
        "luftpause_interactive_owed_seconds",
        "Turn-seconds interactive had beyond its weighted share (past 1: batch goes first)",
        labels=["model"],
    )
    weight = state.rules.interactive_weight
    for model, share in sorted(state.shares.items()):
        part.add_metric([model], shares.part(share, now))
        owed.add_metric([model], shares.owed(share, weight, now))
    yield from (part, owed)


def _budgets(state: State, now: float) -> Iterator[Metric]:
    """Each rate-limit window's budgets (see `core.budget_status`)."""
    labels = ["window", "kind", "dimension"]
    limit = GaugeMetricFamily(
        "luftpause_budget_limit", "A rate-limit budget per window (minute or day)", labels=labels
    )
    available = GaugeMetricFamily(
        "luftpause_budget_available",
        "What the budget has now, refills included, before reservations",
        labels=labels,
    )
    reserved = GaugeMetricFamily(
        "luftpause_budget_reserved",
        "Reserved by admitted turns and not yet counted by the provider",
        labels=labels,
    )
    refill = GaugeMetricFamily(
        "luftpause_budget_refill_seconds",
        "Seconds until the budget next refills (fixed) or is full (continuous)",
        labels=labels,
    )
    per_window = ["window", "kind"]
    k = GaugeMetricFamily(
        "luftpause_budget_k", "Safety factor on predicted replies", labels=per_window
    )
    cooldown = GaugeMetricFamily(
        "luftpause_budget_cooldown_seconds", "Cooldown left after a 429", labels=per_window
    )
    held = GaugeMetricFamily(
        "luftpause_budget_held_turns", "Turns held for the window", labels=per_window
    )
    refused = GaugeMetricFamily(
        "luftpause_budget_refused", "Turns refused as bigger than the window", labels=per_window
    )
    provider = GaugeMetricFamily(
        "luftpause_budget_provider_429s", "429s the provider sent", labels=per_window
    )
    used = GaugeMetricFamily(
        "luftpause_budget_used_today_tokens",
        "A caller key's tokens used today (UTC)",
        labels=per_window,
    )
    for b in budgets_view(state, now):
        ids = [b["id"], b["kind"]]
        k.add_metric(ids, b["k"])
        cooldown.add_metric(ids, b["cooldown_s"])
        held.add_metric(ids, b["held"])
        refused.add_metric(ids, b["refused"])
        provider.add_metric(ids, b["provider_429s"])
        if b["used_today"] is not None:
            used.add_metric(ids, b["used_today"])
        for dim in b["dimensions"]:
            at = [*ids, dim["name"]]
            limit.add_metric(at, dim["limit"])
            if dim["available"] is not None:
                available.add_metric(at, dim["available"])
            reserved.add_metric(at, dim["reserved"])
            if dim["refill_s"] >= 0:
                refill.add_metric(at, dim["refill_s"])
    yield from (limit, available, reserved, refill, k, cooldown, held, refused, provider, used)


def _pool(state: State) -> Iterator[Metric]:
    """Each replica's engine load and KV pool against the runs resident there."""
    running = GaugeMetricFamily(
        "luftpause_replica_engine_running_requests",
        "Requests the replica's engine runs, from its last probe (absent while it says none)",
        labels=["replica"],
    )
    waiting = GaugeMetricFamily(
        "luftpause_replica_engine_waiting_requests",
        "Requests the replica's engine queues, from its last probe (absent while it says none)",
        labels=["replica"],
    )
    pool = GaugeMetricFamily(
        "luftpause_replica_kv_pool_tokens",
        "The engine's KV pool in tokens (endpoint kv_tokens or the engine's; absent if unknown)",
        labels=["replica"],
    )
    used = GaugeMetricFamily(
        "luftpause_replica_kv_used_tokens",
        "KV tokens the engine's batch held at its last probe (absent if unknown)",
        labels=["replica"],
    )
    resident = GaugeMetricFamily(
        "luftpause_replica_resident_tokens",
        "Sum of the KV footprints of the runs resident on the replica",
        labels=["replica"],
    )
    resident_runs = GaugeMetricFamily(
        "luftpause_replica_resident_runs", "Runs resident on the replica", labels=["replica"]
    )
    pending = GaugeMetricFamily(
        "luftpause_replica_pending_prefill_tokens",
        "Prompt tokens the turns in flight on the replica are expected to read and have not "
        "shown a first token for",
        labels=["replica"],
    )
    counts = dict.fromkeys(state.replicas, 0)
    for run in state.runs.values():
        if run.footprint and run.replica in counts:
            counts[run.replica] += 1
    for r in state.replicas.values():
        for family, value in (
            (running, r.engine_running),
            (waiting, r.engine_waiting),
            (pool, r.kv_tokens),
            (used, r.kv_used),
        ):
            if value is not None:
                family.add_metric([r.id], value)
        resident.add_metric([r.id], r.resident_tokens)
        resident_runs.add_metric([r.id], counts[r.id])
        pending.add_metric([r.id], r.pending_prefill)
    yield from (running, waiting, pool, used, resident, resident_runs, pending)


class SchedulerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # Reads the current state at scrape time (`bind`); None until bound.
        self.state: Callable[[], State] | None = None
        self.clock: Callable[[], float] = time.monotonic
        self.refused_for_budget = Counter(
            "luftpause_turns_refused_for_budget",
            "Turns refused at once: bigger than every rate-limit window, or a key's day spent",
            registry=self.registry,
        )
        self.admitted = Counter(
            "luftpause_turns_admitted",
            "Turns placed on a replica",
            ["class"],
            registry=self.registry,
        )
        self.held_turns = Counter(
            "luftpause_turns_held",
            "Turns that waited in the scheduler before placement",
            ["class"],
            registry=self.registry,
        )
        self.failed = Counter(
            "luftpause_turns_failed",
            "Turns reported failed or abandoned",
            ["class"],
            registry=self.registry,
        )
        self.placed_by_dataplane = Counter(
            "luftpause_turns_placed_by_dataplane",
            "Turns a dataplane placed itself on an open replica and reported",
            registry=self.registry,
        )
        self.expired = Counter(
            "luftpause_turns_expired",
            "Turns dropped after the turn timeout",
            registry=self.registry,
        )
        self.held_seconds = Histogram(
            "luftpause_held_seconds",
            "Time a turn waited in the scheduler",
            ["class"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.admit_seconds = Histogram(
            "luftpause_admit_seconds",
            "Admit RPC handling time, hold included",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self))

    def bind(self, state: Callable[[], State], clock: Callable[[], float] | None = None) -> None:
        """Read the state's gauges through `state()` (at `clock()`) at every scrape."""
        self.state = state
        if clock is not None:
            self.clock = clock

    def placed(self, action: Place, state: State) -> None:
        turn = state.turns.get(action.turn_id)
        cls = str(turn.service_class) if turn else "interactive"
        self.admitted.labels(cls).inc()
        self.held_seconds.labels(cls).observe(action.held_s)
        if action.held_s > 0:
            self.held_turns.labels(cls).inc()

    def abandoned(self, state: State, turn_id: str) -> None:
        turn = state.turns.get(turn_id) or state.held.get(turn_id) or state.budget_held.get(turn_id)
        if turn is not None:
            self.failed.labels(str(turn.service_class)).inc()

    def failed_turn(self, state: State, turn_id: str) -> None:
        turn = state.turns.get(turn_id)
        if turn is not None:
            self.failed.labels(str(turn.service_class)).inc()

    def turn_expired(self) -> None:
        self.expired.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
