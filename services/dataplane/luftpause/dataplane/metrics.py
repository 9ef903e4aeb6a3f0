"""Prometheus metrics of one dataplane process.

Shell module. Each app gets its own registry (tests run several in one process). Label
children are bound once here, so the hot path does one lock-protected add per turn and no
label lookups; the gauges (open streams, the scheduler link) are read at scrape time by a
collector, from a plain counter the proxy keeps and from the link:

    luftpause_dataplane_turns_total{service_class,outcome}              counter
    luftpause_dataplane_api_turns_total{api,path}                      counter
    luftpause_dataplane_proxied_bytes_total{direction}                  counter
    luftpause_dataplane_time_to_first_byte_seconds{service_class}       histogram
    luftpause_dataplane_added_first_byte_seconds{service_class}         histogram
    luftpause_dataplane_open_streams                                    gauge
    luftpause_dataplane_scheduler_link_up                               gauge
    luftpause_dataplane_scheduler_reconnects_total                      counter
    luftpause_dataplane_placed_locally_total                            counter
    luftpause_dataplane_slot_actions_total{action,outcome}              counter
    luftpause_dataplane_ratelimit_limit{replica,budget}                 gauge
    luftpause_dataplane_ratelimit_remaining{replica,budget}             gauge
    luftpause_dataplane_ratelimit_reset_timestamp_seconds{replica,budget}  gauge
    luftpause_dataplane_ratelimit_retry_after_seconds{replica}          gauge
    luftpause_dataplane_ratelimit_headers_malformed_total{replica}      counter
    luftpause_dataplane_rate_limited_total{replica}                     counter
    luftpause_dataplane_rate_limited_wait_seconds_total{replica}        counter

The rate-limit gauges are each hosted replica's budget as its latest reply reported it
(`luftpause.common.ratelimits`), with the reset as a Unix time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from luftpause.common.ratelimits import Reading
from luftpause.dataplane.apis import Api
from luftpause.dataplane.identity import ServiceClass

# "retried": refused for the engine's rate limit and sent again (the client never saw it).
OUTCOMES = ("finished", "failed", "abandoned", "retried")
_TTFB_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# The dataplane's own share is a few hundred microseconds when all is well.
_ADDED_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1,
)  # fmt: skip


class LinkState(Protocol):
    """What the metrics read of the scheduler link (`link.SchedulerLink`)."""

    @property
    def ready(self) -> bool: ...

    @property
    def sessions(self) -> int: ...


class _StateCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "luftpause_dataplane_open_streams",
            "Streamed (SSE) replies being relayed from an engine to a client now.",
            value=self._metrics.open_streams,
        )
        link = self._metrics.link
        yield GaugeMetricFamily(
            "luftpause_dataplane_scheduler_link_up",
            "1 while the Report stream to the scheduler is up (resynced), 0 while it is down "
            "and turns that need the scheduler are held.",
            value=1 if link is not None and link.ready else 0,
        )
        yield CounterMetricFamily(
            "luftpause_dataplane_scheduler_reconnects",
            "Report streams to the scheduler opened again after a break (the first not counted).",
            value=0 if link is None else max(link.sessions - 1, 0),
        )
        yield from self._rate_limits()

    def _rate_limits(self) -> Iterator[Metric]:
        readings = self._metrics.readings
        if not readings:
            return
        gauges = {
            "limit": GaugeMetricFamily(
                "luftpause_dataplane_ratelimit_limit",
                "A hosted replica's rate-limit budget (requests, tokens, input_tokens, "
                "output_tokens) per window, as its latest reply reported it.",
                labels=["replica", "budget"],
            ),
            "remaining": GaugeMetricFamily(
                "luftpause_dataplane_ratelimit_remaining",
                "What remained of a hosted replica's rate-limit budget at its latest reply.",
                labels=["replica", "budget"],
            ),
            "reset": GaugeMetricFamily(
                "luftpause_dataplane_ratelimit_reset_timestamp_seconds",
                "When a hosted replica's rate-limit budget refills, as its latest reply said "
                "(Unix time).",
                labels=["replica", "budget"],
            ),
        }
        retry = GaugeMetricFamily(
            "luftpause_dataplane_ratelimit_retry_after_seconds",
            "The Retry-After of a hosted replica's latest reply that had one.",
            labels=["replica"],
        )
        for replica, (reading, at) in sorted(readings.items()):
            for name, budget in reading.budgets.items():
                if budget.limit is not None:
                    gauges["limit"].add_metric([replica, name], budget.limit)
                if budget.remaining is not None:
                    gauges["remaining"].add_metric([replica, name], budget.remaining)
                if budget.reset_s is not None:
                    gauges["reset"].add_metric([replica, name], at + budget.reset_s)
            if reading.retry_after_s is not None:
                retry.add_metric([replica], reading.retry_after_s)
        yield from gauges.values()
        yield retry


class Metrics:
    """Turns by class and outcome, proxied bytes, time to first byte and the dataplane's own
    share of it, open streams, the scheduler link."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Kept by the proxy around each streamed relay; read at scrape time.
        self.open_streams = 0
        self.link: LinkState | None = None
        turns = Counter(
            "luftpause_dataplane_turns",
            "Turns that reached the scheduler, by service class and outcome.",
            ["service_class", "outcome"],
            registry=self.registry,
        )
        self._turns = {
            (cls, outcome): turns.labels(cls.name.lower(), outcome)
            for cls in ServiceClass
            for outcome in OUTCOMES
        }
        proxied = Counter(
            "luftpause_dataplane_proxied_bytes",
            "Body bytes proxied, counted when each turn ends: request (to the engine) and "
            "response (streamed or not, to the client).",
            ["direction"],
            registry=self.registry,
        )
        self._request_bytes = proxied.labels("request")
        self._response_bytes = proxied.labels("response")
        ttfb = Histogram(
            "luftpause_dataplane_time_to_first_byte_seconds",
            "From the request's arrival to the first response body byte sent to the client "
            "(admission wait included).",
            ["service_class"],
            buckets=_TTFB_BUCKETS,
            registry=self.registry,
        )
        self._ttfb = {cls: ttfb.labels(cls.name.lower()) for cls in ServiceClass}
        added = Histogram(
            "luftpause_dataplane_added_first_byte_seconds",
            "The dataplane's own share of a chat completion's time to first byte: from the "
            "request's arrival to the request going to the engine, less the wait for the "
            "scheduler's placement (hold included) and for saved slot calls, plus the time from "
            "the engine's first body bytes arriving to their being sent to the client.",
            ["service_class"],
            buckets=_ADDED_BUCKETS,
            registry=self.registry,
        )
        self._added = {cls: added.labels(cls.name.lower()) for cls in ServiceClass}
        doors = Counter(
            "luftpause_dataplane_api_turns",
            "Turns sent to an engine by the API the client spoke (chat, messages, responses): "
            "passed to an engine serving that API as they were, or translated to Chat "
            "Completions (path).",
            ["api", "path"],
            registry=self.registry,
        )
        self._doors = {
            (api, translated): doors.labels(api.value, "translated" if translated else "passed")
            for api in Api
            for translated in (False, True)
        }
        self.placed_locally = Counter(
            "luftpause_dataplane_placed_locally",
            "Turns placed on an open replica by this dataplane itself, without a round trip "
            "to the scheduler (the rest were placed by the scheduler).",
            registry=self.registry,
        )
        actions = Counter(
            "luftpause_dataplane_slot_actions",
            "llama.cpp slot saves and restores around turns (endpoint `slot_saves`), by action "
            "and outcome; a failed one costs a prefill, never the turn.",
            ["action", "outcome"],
            registry=self.registry,
        )
        self._slot_actions = {
            (action, ok): actions.labels(action, "ok" if ok else "failed")
            for action in ("save", "restore")
            for ok in (True, False)
        }
        # Per replica: the latest rate-limit reading and when (Unix time) it was read.
        self.readings: dict[str, tuple[Reading, float]] = {}
        self._malformed = Counter(
            "luftpause_dataplane_ratelimit_headers_malformed",
            "Rate-limit headers of a hosted replica's replies that could not be read (left "
            "out of its reading; see the dataplane's log for which).",
            ["replica"],
            registry=self.registry,
        )
        self._limited = Counter(
            "luftpause_dataplane_rate_limited",
            "Turns an engine refused for its rate limit that the dataplane waited out and sent "
            "again (the client saw no 429).",
            ["replica"],
            registry=self.registry,
        )
        self._limited_wait = Counter(
            "luftpause_dataplane_rate_limited_wait_seconds",
            "Seconds turns spent waiting out rate-limit refusals before being sent again.",
            ["replica"],
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self))

    def watch_link(self, link: LinkState) -> None:
        """Report `link`'s state (up or down, reconnects) at every scrape."""
        self.link = link

    def slot_action(self, action: str, ok: bool) -> None:
        self._slot_actions[(action, ok)].inc()

    def turn(
        self, service_class: ServiceClass, outcome: str, request_bytes: int, response_bytes: int
    ) -> None:
        """Count one turn at its end."""
        self._turns[(service_class, outcome)].inc()
        if request_bytes:
            self._request_bytes.inc(request_bytes)
        if response_bytes:
            self._response_bytes.inc(response_bytes)

    def door(self, api: Api, translated: bool) -> None:
        """Count a turn of `api` going to an engine, passed or translated."""
        self._doors[(api, translated)].inc()

    def first_byte(
        self, service_class: ServiceClass, seconds: float, added: float | None = None
    ) -> None:
        """A turn's time to first byte, and the dataplane's own share of it when known."""
        self._ttfb[service_class].observe(seconds)
        if added is not None:
            self._added[service_class].observe(added)

    def rate_limits(self, replica: str, reading: Reading, at: float) -> None:
        """Keep `replica`'s latest rate-limit reading (read at Unix time `at`)."""
        if reading.budgets or reading.retry_after_s is not None:
            self.readings[replica] = (reading, at)
        if reading.malformed:
            self._malformed.labels(replica).inc(len(reading.malformed))

    def rate_limited(self, replica: str, wait_s: float) -> None:
        """A refusal for `replica`'s rate limit, waited out for `wait_s` before sending again."""
        self._limited.labels(replica).inc()
        self._limited_wait.labels(replica).inc(wait_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
