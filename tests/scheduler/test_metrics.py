"""The scheduler's pool gauges, read from its state at scrape time: no sockets, no event loop."""

from __future__ import annotations

from luftpause.common.config import Endpoint
from luftpause.common.limits import Limits
from luftpause.scheduler.core.events import Admit, ProbeResult, Reject, TurnFinished
from luftpause.scheduler.core.model import ServiceClass
from luftpause.scheduler.host import SchedulerHost
from tests.scheduler.helpers import MODEL


def value(host: SchedulerHost, name: str, replica: str) -> float | None:
    return host.metrics.registry.get_sample_value(name, {"replica": replica})


def test_each_replica_shows_its_engine_load_and_kv_pool_against_its_resident_runs() -> None:
    host = SchedulerHost(
        Endpoint(id=i, url=f"http://{i}:1", models=frozenset({MODEL})) for i in ("a", "b")
    )
    host.apply(
        ProbeResult(
            at=0.0, replica_id="a", healthy=True, running=2, waiting=1, kv_total=50_000, kv_used=900
        )
    )
    host.apply(ProbeResult(at=0.0, replica_id="b", healthy=True))
    host.apply(
        Admit(
            at=1.0,
            turn_id="t1",
            run_id="r1",
            model=MODEL,
            service_class=ServiceClass.INTERACTIVE,
            caller="",
        )
    )
    replica = host.state.runs["r1"].replica
    # The turn ends with tool calls: its run stays resident where it ran, with its footprint.
    host.apply(
        TurnFinished(
            at=2.0, turn_id="t1", tool_calls=True, prompt_tokens=1000, completion_tokens=20
        )
    )

    assert value(host, "luftpause_replica_engine_running_requests", "a") == 2
    assert value(host, "luftpause_replica_engine_waiting_requests", "a") == 1
    assert value(host, "luftpause_replica_kv_pool_tokens", "a") == 50_000
    assert value(host, "luftpause_replica_kv_used_tokens", "a") == 900
    # b's engine says nothing: its series are absent rather than a made-up zero.
    assert value(host, "luftpause_replica_engine_running_requests", "b") is None
    assert value(host, "luftpause_replica_kv_pool_tokens", "b") is None
    resident = host.state.replicas[replica].resident_tokens
    assert resident > 0
    assert value(host, "luftpause_replica_resident_tokens", replica) == resident
    assert value(host, "luftpause_replica_resident_runs", replica) == 1
    other = "b" if replica == "a" else "a"
    assert value(host, "luftpause_replica_resident_runs", other) == 0


def test_each_rate_limit_window_shows_its_budget_reservations_k_and_refusals() -> None:
    host = SchedulerHost(
        [Endpoint(id="api", url="http://api:1", models=frozenset({MODEL}), limits=Limits(tpm=600))],
        clock=lambda: 1.0,
    )
    host.apply(ProbeResult(at=0.0, replica_id="api", healthy=True))
    host.apply(Admit(at=1.0, turn_id="t1", run_id="r1", model=MODEL, prompt_bytes=400))
    refused = host.apply(Admit(at=1.0, turn_id="big", run_id="r2", model=MODEL, prompt_bytes=9000))
    assert isinstance(refused[0], Reject)
    labels = {"window": "api", "kind": "endpoint", "dimension": "tokens"}
    sample = host.metrics.registry.get_sample_value
    assert sample("luftpause_budget_limit", labels) == 600
    assert sample("luftpause_budget_reserved", labels) == 100 + 256  # prompt + default reply
    assert sample("luftpause_budget_k", {"window": "api", "kind": "endpoint"}) == 2.0
    assert sample("luftpause_budget_refused", {"window": "api", "kind": "endpoint"}) == 1
    assert sample("luftpause_turns_refused_for_budget_total", {}) == 1
