"""Prometheus metrics of one dataplane process.

Shell module. Each app gets its own registry (tests run several in one process). Label
children are bound once here, so the hot path does one lock-protected add per turn and no
label lookups.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from luftpause.dataplane.identity import ServiceClass

OUTCOMES = ("finished", "failed", "abandoned")
_TTFB_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """Turns by class and outcome, proxied bytes, time to first byte."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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
            "Body bytes proxied: request to the engine, response to the client.",
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

    def first_byte(self, service_class: ServiceClass, seconds: float) -> None:
        self._ttfb[service_class].observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
