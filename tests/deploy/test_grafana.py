"""The Grafana dashboard (deploy/grafana/luftpause.json) reads only metrics the services export.

Every PromQL expression is parsed (`promql`) and each metric name it selects is looked up among
the sample names of the three services' registries, built in-process without sockets: the
scheduler's `SchedulerMetrics` (bound to a host), the dataplane's `Metrics` and the runtime's
`RuntimeMetrics`. A counter exports `<name>_total` and `<name>_created`, a histogram `_bucket`,
`_sum`, `_count` and `_created`, a gauge its name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from luftpause.common.config import Endpoint
from luftpause.dataplane.metrics import Metrics
from luftpause.runtime.server.metrics import RuntimeMetrics
from luftpause.scheduler.host import SchedulerHost
from tests.deploy.promql import PromQLError, metric_names

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "luftpause.json"
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}


def sample_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry can export, whether or not it has a sample yet."""
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in SUFFIXES.get(family.type, ("",))
    }


def exported() -> dict[str, set[str]]:
    """Sample names by service."""
    host = SchedulerHost([Endpoint(id="a", url="http://a:1", models=frozenset({"m"}))])
    return {
        "scheduler": sample_names(host.metrics.registry),
        "dataplane": sample_names(Metrics().registry),
        "runtime": sample_names(RuntimeMetrics().registry),
    }


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(container: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside (collapsed) rows too."""
    for panel in container.get("panels", []):
        yield panel
        yield from panels(panel)


def expressions() -> list[tuple[str, str]]:
    """(panel title, expression) of every query."""
    return [(p["title"], t["expr"]) for p in panels(dashboard()) for t in p.get("targets", [])]


def test_every_expression_reads_only_metrics_the_services_export() -> None:
    names = set().union(*exported().values())
    exprs = expressions()
    assert len(exprs) >= 20
    for title, expr in exprs:
        used = metric_names(expr)
        assert used, f"{title}: {expr!r} reads no metric"
        assert used <= names, f"{title}: {sorted(used - names)} are exported by no service"


def test_the_dashboard_shows_every_service() -> None:
    used = set().union(*(metric_names(e) for _, e in expressions()))
    for service, names in exported().items():
        assert used & names, f"no panel reads the {service}'s metrics"
    for wanted in (
        "luftpause_replica_in_flight_turns",
        "luftpause_replica_capacity",
        "luftpause_replica_engine_running_requests",
        "luftpause_replica_engine_waiting_requests",
        "luftpause_replica_resident_tokens",
        "luftpause_replica_kv_pool_tokens",
        "luftpause_held_turns",
        "luftpause_dataplane_turns_total",
        "luftpause_dataplane_time_to_first_byte_seconds_bucket",
        "luftpause_dataplane_added_first_byte_seconds_bucket",
        "luftpause_runtime_runs",
        "luftpause_runtime_tool_calls_total",
        "luftpause_runtime_approvals_waiting",
        "luftpause_runtime_journal_append_seconds_bucket",
    ):
        assert wanted in used, f"no panel shows {wanted}"


def test_every_panel_queries_the_datasource_variable() -> None:
    data = dashboard()
    (variable,) = [v for v in data["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    ref = "${" + variable["name"] + "}"
    queried = [p for p in panels(data) if p["type"] != "row"]
    assert queried
    for p in queried:
        assert p["datasource"] == {"type": "prometheus", "uid": ref}, p["title"]
        assert all(t["datasource"]["uid"] == ref for t in p["targets"]), p["title"]


def test_panels_do_not_overlap_and_have_unique_ids() -> None:
    cells: dict[tuple[int, int], str] = {}
    ids = [p["id"] for p in panels(dashboard())]
    assert len(ids) == len(set(ids))
    for p in panels(dashboard()):
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_the_reader_finds_metric_names_and_skips_labels_functions_and_variables() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, class) (rate(a_seconds_bucket{x="y",le!~"1"}'
        "[$__rate_interval]))) / on(job) group_left(z) b:recorded offset 5m > bool 0.5"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b:recorded"}
    assert metric_names("sum(rate(c_total[5m])) without (replica) or vector(0)") == {"c_total"}


@pytest.mark.parametrize("expr", ["sum(rate(x[5m])", "sum(x]", "nosuchfn(x)", "x # y"])
def test_the_reader_refuses_what_is_not_promql(expr: str) -> None:
    with pytest.raises(PromQLError):
        metric_names(expr)
