"""Prometheus metrics of one runtime process, in its own registry (GET /metrics on the
runtime's port, open like /health).

Shell module. Counters and the journal histogram are updated where things happen
(`loop.runtime` for spawns and ends, `rounds` for tool calls, `budget_guard` for budget trips,
`journal.file` for journal appends, `planner` for spend);
the gauges that describe the runs (by state and class, approvals waiting) are read from the run
table at scrape time by a collector, so the run loop pays nothing for them:

    luftpause_runtime_runs{state,service_class}                   gauge
    luftpause_runtime_approvals_waiting                           gauge
    luftpause_runtime_runs_spawned_total{service_class}           counter
    luftpause_runtime_runs_finished_total{service_class,outcome}  counter
    luftpause_runtime_tool_calls_total{tool}                      counter
    luftpause_runtime_tool_call_failures_total{tool}              counter
    luftpause_runtime_tool_outcomes_unknown_total{then}           counter
    luftpause_runtime_budget_trips_total{kind}                    counter
    luftpause_runtime_spend_usd_total{model}                      counter
    luftpause_runtime_approval_questions_total                    counter
    luftpause_runtime_compactions_total{outcome}                  counter
    luftpause_runtime_journal_append_seconds                      histogram
    luftpause_runtime_journal_write_failures_total{errno}         counter

A tool label is the name of a tool the run was offered; a call to any other name (the model
made it up) counts under `UNKNOWN_TOOL`, so the label's values stay the upstream catalogue's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from luftpause.runtime.core import machine as m
from luftpause.runtime.core.budget import HasState

UNKNOWN_TOOL = "(unknown)"
OUTCOMES = (m.Phase.FINISHED, m.Phase.FAILED, m.Phase.CANCELLED)
# An append is one write and one fsync: tens of microseconds on tmpfs, milliseconds on disks.
_APPEND_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
)  # fmt: skip


class _RunsCollector(Collector):
    """Runs by state and class, and approvals waiting, counted from the run table."""

    def __init__(self, metrics: RuntimeMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        by = {(str(p), c): 0 for p in m.Phase for c in m.SERVICE_CLASSES}
        waiting = 0
        for run in self._metrics.runs.values():
            state = run.state
            key = (str(state.phase), state.spec.service_class)
            by[key] = by.get(key, 0) + 1
            waiting += state.phase is m.Phase.AWAITING_APPROVAL
        runs = GaugeMetricFamily(
            "luftpause_runtime_runs",
            "Runs this runtime knows (from its journal and since), by state and service class.",
            labels=["state", "service_class"],
        )
        for (phase, cls), n in sorted(by.items()):
            runs.add_metric([phase, cls], n)
        yield runs
        yield GaugeMetricFamily(
            "luftpause_runtime_approvals_waiting",
            "Tool calls waiting for the user's approval (runs in state AwaitingApproval).",
            value=waiting,
        )


class RuntimeMetrics:
    """The runtime's counters, histogram and state gauges; `bind` gives it the run table."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.runs: Mapping[str, HasState] = {}
        spawned = Counter(
            "luftpause_runtime_runs_spawned",
            "Runs spawned (resumed runs are not counted again), by service class.",
            ["service_class"],
            registry=self.registry,
        )
        self._spawned = {c: spawned.labels(c) for c in m.SERVICE_CLASSES}
        finished = Counter(
            "luftpause_runtime_runs_finished",
            "Runs that ended in this process, by service class and outcome "
            "(finished, failed, cancelled).",
            ["service_class", "outcome"],
            registry=self.registry,
        )
        self._finished = {
            (c, str(o)): finished.labels(c, str(o)) for c in m.SERVICE_CLASSES for o in OUTCOMES
        }
        self._tool_calls = Counter(
            "luftpause_runtime_tool_calls",
            "Tool calls made by runs (declined and malformed ones included), by tool.",
            ["tool"],
            registry=self.registry,
        )
        self._tool_failures = Counter(
            "luftpause_runtime_tool_call_failures",
            "Tool calls whose result is an error (the tool's, a broken session, a declined "
            "approval, bad arguments), by tool.",
            ["tool"],
            registry=self.registry,
        )
        unknown = Counter(
            "luftpause_runtime_tool_outcomes_unknown",
            "Tool calls sent whose outcome was unknown (a timeout, a session broken after the "
            "request left, a restart), by what followed: resent (the tool is idempotent or "
            "read-only), asked (the user decides), reported (the model is told it may or may "
            "not have run), spent (resent until its time was up).",
            ["then"],
            registry=self.registry,
        )
        self._unknown = {t: unknown.labels(t) for t in ("resent", "asked", "reported", "spent")}
        trips = Counter(
            "luftpause_runtime_budget_trips",
            "Budgets found past their limit (the subtree is then cancelled), by kind.",
            ["kind"],
            registry=self.registry,
        )
        self._trips = {k: trips.labels(k) for k in m.BUDGET_KINDS}
        self._spend = Counter(
            "luftpause_runtime_spend_usd",
            "USD spent on turns of runs whose model has a price (--prices), by model.",
            ["model"],
            registry=self.registry,
        )
        self._asked = Counter(
            "luftpause_runtime_approval_questions",
            "Approval questions put to a person (each counted once; held ones when asked).",
            registry=self.registry,
        )
        self._compactions = Counter(
            "luftpause_runtime_compactions",
            "Run histories compacted before a turn that would not fit the context window.",
            ["outcome"],
            registry=self.registry,
        )
        self.journal_append = Histogram(
            "luftpause_runtime_journal_append_seconds",
            "Time to append one record to runs.jsonl or tasks.jsonl and fsync it, the wait "
            "for the file's lock included; with --journal, to have it committed in the "
            "database (the group commit it waits for included).",
            buckets=_APPEND_BUCKETS,
            registry=self.registry,
        )
        self._write_failures = Counter(
            "luftpause_runtime_journal_write_failures",
            "Writes (or fsyncs) of runs.jsonl or tasks.jsonl that failed and were undone, by "
            "errno (28: no space left on device, 5: I/O error); each is tried again.",
            ["errno"],
            registry=self.registry,
        )
        self.registry.register(_RunsCollector(self))

    def bind(self, runs: Mapping[str, HasState]) -> None:
        """Read the state gauges from `runs` (the live table) at every scrape."""
        self.runs = runs

    def spawned(self, service_class: str) -> None:
        self._spawned[service_class].inc()

    def finished(self, service_class: str, outcome: m.Phase) -> None:
        self._finished[(service_class, str(outcome))].inc()

    def tool_called(self, tool: str, ok: bool) -> None:
        self._tool_calls.labels(tool).inc()
        if not ok:
            self._tool_failures.labels(tool).inc()

    def tool_unknown(self, then: str) -> None:
        """A sent call's outcome was unknown (`toolcalls`); `then` what followed."""
        self._unknown[then].inc()

    def budget_tripped(self, kind: str) -> None:
        self._trips[kind].inc()

    def spent(self, model: str, usd: float) -> None:
        self._spend.labels(model).inc(usd)

    def journal_failed(self, errno: str) -> None:
        """A journal write failed and was undone (`journal.file`)."""
        self._write_failures.labels(errno).inc()

    def asked(self) -> None:
        """An approval question was put to a person (`question_gate`)."""
        self._asked.inc()

    def compacted(self, outcome: str) -> None:
        """A run's history was compacted (`wall`): `summarised` or `truncated`."""
        self._compactions.labels(outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
