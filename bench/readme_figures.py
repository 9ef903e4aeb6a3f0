"""The README's measured figures, each rendered from the result file it cites.

Run: `.venv/bin/python -m bench.readme_figures` prints every figure the README should show and
whether it does. Each `Figure` names its result file (bench/results/NAME.json) and renders the
exact text the README carries for it, so a rerun that moves a number fails the test
(tests/test_readme_figures.py) until the README says what the file says, and a figure that no
file backs cannot be registered. The files record the commit they ran on (`machine.commit`,
bench.common.provenance), which the README says under each table.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.common import RESULTS
from bench.matrix_report import BASELINE, OURS, arm_figures, verdict

README = RESULTS.parent.parent / "README.md"


@dataclass(frozen=True, slots=True)
class Figure:
    what: str
    source: str
    render: Callable[[dict[str, Any]], str]

    def text(self) -> str:
        return self.render(load(self.source))


def load(source: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / source).read_text())
    return data


def x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def matrix_row(label: str, cell: str) -> Callable[[dict[str, Any]], str]:
    """A row of the README's matrix table: its label, then interactive and batch ratios."""

    def render(data: dict[str, Any]) -> str:
        results = data["cells"][cell]["results"]
        v = verdict(cell, arm_figures(results[OURS]), arm_figures(results[BASELINE]))
        return f"| {label} | {x(v['interactive_x'])} | {x(v['batch_x'])} |"

    return render


def matrix_group(label: str, engine: str, kv: str) -> Callable[[dict[str, Any]], str]:
    """A grouped row of the README's matrix table: the simulated cells of one engine and KV size
    (both tool styles, both kinds of context), each ratio's range over them, and the share of
    prompt tokens from cache, luftpause's range / cache_aware's."""

    def render(data: dict[str, Any]) -> str:
        names = sorted(n for n in data["cells"] if n.startswith(f"{engine}-") and n.endswith(kv))
        ix, bx, ours, base = [], [], [], []
        for name in names:
            results = data["cells"][name]["results"]
            o, b = arm_figures(results[OURS]), arm_figures(results[BASELINE])
            v = verdict(name, o, b)
            ix.append(v["interactive_x"])
            bx.append(v["batch_x"])
            ours.append(100 * statistics.median(o["cached"]))
            base.append(100 * statistics.median(b["cached"]))

        def span(values: list[float], fmt: str) -> str:
            return f"{min(values):{fmt}}-{max(values):{fmt}}"

        return (
            f"| {label} | {span(ix, '.2f')}x | {span(bx, '.2f')}x | "
            f"{span(ours, '.0f')} / {span(base, '.0f')} % |"
        )

    return render


def _med(figures: dict[str, Any], key: str) -> float:
    value: float = figures[key]["median"]
    return value


def ratelimit_row(label: str, scenario: str) -> Callable[[dict[str, Any]], str]:
    """A row of the README's rate-limit table: medians over the seeds of the 429s at the
    provider (direct with the openai defaults, a patient client, LiteLLM, luftpause without
    `limits`), the errors clients saw (direct, LiteLLM, luftpause), luftpause's wall clock over
    the earliest the budgets allow (direct's), and the turn p90 (LiteLLM, luftpause)."""

    def render(data: dict[str, Any]) -> str:
        arms = data["scenarios"][scenario]["summary"]
        refused = " / ".join(
            f"{_med(arms[a], 'provider_429s'):g}"
            for a in ("direct", "direct-patient", "litellm", "luftpause")
        )
        errors = " / ".join(
            f"{_med(arms[a], 'errors'):g}" for a in ("direct", "litellm", "luftpause")
        )
        wall = (
            f"{_med(arms['luftpause'], 'wall_over_earliest'):.2f} "
            f"({_med(arms['direct'], 'wall_over_earliest'):.2f})"
        )
        p90 = (
            f"{_med(arms['litellm'], 'turn_p90_s'):.1f} / "
            f"{_med(arms['luftpause'], 'turn_p90_s'):.1f} s"
        )
        return f"| {label} | {refused} | {errors} | {wall} | {p90} |"

    return render


def family_line(data: dict[str, Any]) -> str:
    """The family's distribution of luftpause / cache_aware, batch then interactive runs/min,
    and the models behind on both classes with their ratios (and their standard errors over
    the seeds, where pooled)."""
    s = data["summary"]
    b, i = s["batch"], s["interactive"]
    models = {m["name"]: m for m in data["models"]}

    def named(name: str) -> str:
        r, se = models[name]["ratio"], models[name].get("ratio_se")
        text = f"{name} {r['interactive']:.3f}x / {r['batch']:.3f}x"
        if se and se["interactive"] is not None and se["batch"] is not None:
            text += f" (± {se['interactive']:.3f} / {se['batch']:.3f})"
        return text

    behind = ", ".join(named(name) for name in s["behind"])
    return (
        f"batch at a median of {b['median']:.2f}x (worst {b['min']:.2f}x, 10th percentile "
        f"{b['p10']:.2f}x), interactive {i['median']:.2f}x (90th percentile {i['p90']:.2f}x, "
        f"best {i['max']:.2f}x); behind on both classes: {behind or 'none'}"
    )


def model_line(name: str) -> Callable[[dict[str, Any]], str]:
    """One pooled model's ratios with their standard errors: `0.978x ± 0.007 interactive and
    0.996x ± 0.004 batch`."""

    def render(data: dict[str, Any]) -> str:
        m = next(m for m in data["models"] if m["name"] == name)
        r, se = m["ratio"], m["ratio_se"]
        return (
            f"{r['interactive']:.3f}x ± {se['interactive']:.3f} interactive and "
            f"{r['batch']:.3f}x ± {se['batch']:.3f} batch"
        )

    return render


def core_against_line(data: dict[str, Any]) -> str:
    """The core against an older one, alternated in one run: saturated at 10,000 and 100,000
    live runs, and the range with 1,000."""
    rows = {(r["saturated"], r["runs"]): r for r in data["comparison"][0]["rows"]}
    ten, hundred = rows[(True, 10_000)], rows[(True, 100_000)]
    few = [rows[(s, 1_000)]["ratio"] for s in (False, True)]
    return (
        f"{ten['ratio']:.2f}x saturated at 10,000 runs ({ten['new']['events_per_s']:,} against "
        f"{ten['old']['events_per_s']:,} events/s), {hundred['ratio']:.2f}x at 100,000, "
        f"{min(few):.2f}-{max(few):.2f}x with 1,000 runs"
    )


def _commit(data: dict[str, Any]) -> str:
    return str(data["machine"].get("commit") or "?")[:7]


def ran_on_as(what: str) -> Callable[[dict[str, Any]], str]:
    """`what 1a2b3c4`: the commit a result ran on, named where the README names several."""
    return lambda data: f"{what} {_commit(data)}"


def ran_on(data: dict[str, Any]) -> str:
    """`commit 1a2b3c4`: what a result ran on, as the README says under its table."""
    return f"commit {_commit(data)}"


def _flood_medians(reps: list[dict[str, Any]]) -> dict[str, float]:
    def med(cls: str, key: str) -> float:
        return float(statistics.median(r[cls][key] for r in reps))

    return {
        "interactive": med("interactive", "runs_per_min"),
        "p50": med("interactive", "run_time_p50_s"),
        "batch": med("batch", "runs_per_min"),
    }


def best_router(results: dict[str, list[dict[str, Any]]]) -> str:
    """The router arm with the most interactive runs/min (the flood's question), batch breaking
    a tie: the peer at its best for what the table asks."""
    routers = [a for a in results if a.startswith("router-")]
    medians = {a: _flood_medians(results[a]) for a in routers}
    return max(routers, key=lambda a: (medians[a]["interactive"], medians[a]["batch"]))


def flood_row(label: str, original: str) -> Callable[[dict[str, Any]], str]:
    """A row of the README's flood table: luftpause's medians against the best router arm's."""

    def render(data: dict[str, Any]) -> str:
        results = data["results"]
        peer = best_router(results)
        o, b = _flood_medians(results["luftpause"]), _flood_medians(results[peer])
        change = 100.0 * (o["batch"] / b["batch"] - 1.0)
        return (
            f"| {label} | {peer.removeprefix('router-')} | {o['interactive']:.1f} against "
            f"{b['interactive']:.1f} ({o['interactive'] / b['interactive']:.2f}x) | "
            f"{o['p50']:.1f} against {b['p50']:.1f} s | {o['batch']:.0f} against "
            f"{b['batch']:.0f} ({change:+.1f} %) | {original} |"
        )

    return render


def overhead_row(label: str, arm: str) -> Callable[[dict[str, Any]], str]:
    """A row of the README's overhead table: added time to first byte at 1 and 32 streams
    (medians over the rounds) and streams/s at 32 clients."""

    def render(data: dict[str, Any]) -> str:
        results = data["results"]
        cells = []
        for c, digits in ((1, 2), (32, 1)):
            added = results[f"c{c}_stream"].get("added_ms", {}).get(f"{arm}_ttfb_p50")
            cells.append("-" if added is None else f"{added['median']:.{digits}f} ms")
        rps = results["c32_stream"]["arms"][arm]["rps"]["median"]
        # A peer's row names the version that ran (`bench.common.versions`).
        version = data["machine"].get("versions", {}).get(arm, "")
        name = f"{label} {version}".strip()
        return f"| {name} | {cells[0]} | {cells[1]} | {rps:,.0f} |"

    return render


def tracing_line(data: dict[str, Any]) -> str:
    """What tracing adds: the traced dataplane against the untraced one in the same run, to a
    stream's first byte (p50) at 1 and 32 streams and in CPU per streamed turn."""
    results = data["results"]

    def added(c: int) -> float:
        ms = results[f"c{c}_stream"]["added_ms"]
        return float(ms["dataplane-traced_ttfb_p50"]["median"] - ms["dataplane_ttfb_p50"]["median"])

    def cpu(c: int) -> float:
        arms = results[f"c{c}_stream"]["arms"]
        return float(
            arms["dataplane-traced"]["cpu_ms_per_turn"]["median"]
            - arms["dataplane"]["cpu_ms_per_turn"]["median"]
        )

    return (
        f"Tracing on (every turn traced) adds {added(1):.1f} ms to a stream's first byte at 1 "
        f"stream and {added(32):.1f} ms at 32, and {cpu(1):.2f} / {cpu(32):.2f} ms of CPU per "
        "streamed turn at 1 / 32 clients"
    )


def core_line(data: dict[str, Any]) -> str:
    """The decision core's events/s at 10,000 live runs, with room and saturated."""
    rows = {(r["saturated"], r["runs"]): r for r in data["throughput"]}
    room, full = rows[(False, 10_000)], rows[(True, 10_000)]
    return (
        f"{room['events_per_s']:,} events/s on engines with room, "
        f"{full['events_per_s']:,} saturated"
    )


RATELIMIT_ROWS = (
    ("fixed window", "fixed-openai"),
    ("token bucket", "continuous-openai"),
    ("token bucket, input and output budgets", "continuous-anthropic"),
    ("two providers of one model", "two-providers"),
)

FIGURES: list[Figure] = [
    Figure(
        "matrix, llama.cpp plain messages",
        "matrix_real_s40_text.json",
        matrix_row("llama.cpp, tool results as plain messages", "real-text"),
    ),
    Figure(
        "matrix, llama.cpp tool calls",
        "matrix_real_s41_openai.json",
        matrix_row("llama.cpp, tool calls", "real-openai"),
    ),
    Figure(
        "matrix, llama.cpp tool calls: the commit",
        "matrix_real_s41_openai.json",
        ran_on,
    ),
    Figure("matrix, llama.cpp plain messages: the commit", "matrix_real_s40_text.json", ran_on),
    Figure(
        "matrix, vLLM tool calls",
        "matrix_real_vllm.json",
        matrix_row("vLLM's CPU build, tool calls", "vllm-openai"),
    ),
    Figure(
        "matrix, vLLM plain messages",
        "matrix_real_vllm.json",
        matrix_row("vLLM's CPU build, tool results as plain messages", "vllm-text"),
    ),
    Figure("matrix, vLLM: the commit", "matrix_real_vllm.json", ran_on),
]
MATRIX_GROUPS = (
    ("batching up to their KV, contexts fit (4 cells)", "kv", "fits"),
    ("batching up to their KV, contexts thrash (4)", "kv", "thrash"),
    ("at most 8 requests, contexts fit (4)", "slots", "fits"),
    ("at most 8 requests, contexts thrash (4)", "slots", "thrash"),
)
FIGURES += [
    Figure(f"matrix, {label}", "matrix.json", matrix_group(label, engine, kv))
    for label, engine, kv in MATRIX_GROUPS
]
FIGURES.append(
    Figure(
        "matrix, the simulated rows' commit",
        "matrix.json",
        lambda d: (
            "simulated rows: commit "
            + ", ".join(
                sorted(
                    {
                        p["commit"][:7]
                        for name, c in d["cells"].items()
                        if not name.startswith(("real-", "vllm-"))
                        for p in c.get("provenance") or [{"commit": "?"}]
                    }
                )
            )
        ),
    )
)
FAMILY_AGAIN = {
    "family_check_s41.json": "family_lab_s1.json",
    **{f"family_final_s{n}.json": f"family_lab_s{n}.json" for n in range(2, 7)},
}
"""Each seed of the family run again on later code, and the run the pooled figures came from."""


def _decisions(data: dict[str, Any]) -> dict[str, Any]:
    """A family run's figures by model, without the provenance each model's run records."""
    return {m["name"]: {k: v for k, v in m.items() if k != "provenance"} for m in data["models"]}


def family_again_line(data: dict[str, Any]) -> str:
    """The family's seeds run again on later code: whether every model's figures stayed as they
    were in the runs the README's family figures pool (`data`: the first seed's new run)."""
    pairs = list(FAMILY_AGAIN.items())
    runs = [(data if i == 0 else load(new), load(old)) for i, (new, old) in enumerate(pairs)]
    same = all(_decisions(new) == _decisions(old) for new, old in runs)
    commits = ", ".join(sorted({_commit(m) for _, old in runs for m in _provenances(old)}))
    return f"seeds 1-{len(runs)} on commits {commits} and again on {_commit(data)}, " + (
        "every figure of every model the same to the digit" if same else "with changes"
    )


def _provenances(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each model's provenance as a result's `machine`, for `_commit`."""
    return [{"machine": p} for m in data["models"] for p in _as_list(m.get("provenance") or [])]


def _as_list(value: Any) -> list[dict[str, Any]]:
    return value if isinstance(value, list) else [value]


FIGURES.append(Figure("family, pooled over seeds", "family_lab_pooled.json", family_line))
FIGURES.append(Figure("family, the seeds again", "family_check_s41.json", family_again_line))
FIGURES.append(Figure("family, the commit", "family_lab_pooled.json", ran_on))
FIGURES.append(
    Figure(
        "family, sglang-26-28 at twelve seeds",
        "family_lab_s28_pooled.json",
        model_line("sglang-26-28"),
    )
)
FIGURES += [
    Figure(f"rate limits, {label}", "ratelimit_realtime.json", ratelimit_row(label, scenario))
    for label, scenario in RATELIMIT_ROWS
]
FIGURES.append(
    Figure("rate limits, the commit", "ratelimit_realtime.json", lambda d: f"Commit {_commit(d)}.")
)
FLOOD_ROWS = (
    ("own loop, last turn without tools", "flood.json", "2.0x, -9 %"),
    ("own loop, tools on every turn", "flood_keep_tools.json", "-"),
    ("sub-agents over MCP", "flood_mcp.json", "2.7x, -1 %"),
)
FIGURES += [
    Figure(f"flood, {label}", source, flood_row(label, original))
    for label, source, original in FLOOD_ROWS
]
FIGURES.append(
    Figure(
        "flood, the commits",
        "flood.json",
        lambda d: (
            "commit " + ", ".join(sorted({_commit(load(source)) for _, source, _ in FLOOD_ROWS}))
        ),
    )
)
OVERHEAD_ROWS = (
    ("direct to the engine", "direct"),
    ("luftpause dataplane", "dataplane"),
    ("luftpause dataplane, asking the scheduler for every turn", "dataplane-ask"),
    ("sglang-router", "sglang-router"),
    ("LiteLLM proxy", "litellm"),
)
FIGURES += [
    Figure(f"overhead, {label}", "overhead.json", overhead_row(label, arm))
    for label, arm in OVERHEAD_ROWS
]
FIGURES.append(Figure("overhead, the commit", "overhead.json", ran_on))
FIGURES.append(Figure("overhead, tracing", "overhead.json", tracing_line))


def doors_line(data: dict[str, Any]) -> str:
    """What translating a Messages and a Responses turn adds to its first byte over passing it
    (p50, paired by round, median over the rounds) at 1 and 32 streams."""

    def over(api: str, c: int) -> float:
        value: float = data["results"][f"{api}_c{c}"]["translated_over_passed_ms"]["ttfb_p50"][
            "median"
        ]
        return value

    return (
        f"{over('messages', 1):+.1f} and {over('responses', 1):+.1f} ms at 1 stream, "
        f"{over('messages', 32):+.1f} and {over('responses', 32):+.1f} ms at 32"
    )


FIGURES.append(Figure("overhead, the doors", "overhead_apis.json", doors_line))
FIGURES.append(Figure("decision core", "scheduler_core.json", core_line))
FIGURES.append(Figure("decision core, the commit", "scheduler_core.json", ran_on))
FIGURES.append(
    Figure(
        "admission round trip",
        "admit_rtt.json",
        lambda d: f"takes {d['session']['sequential_ms']['p50']:.2f} ms p50 one at a time",
    )
)
FIGURES.append(
    Figure("decision core, old against new", "scheduler_core_final.json", core_against_line)
)
FIGURES.append(
    Figure("decision core, old against new: the commit", "scheduler_core_final.json", ran_on)
)


def claude_line(data: dict[str, Any]) -> str:
    """Claude Code's six look-ups: the session's median, fanned out and one at a time."""
    fan, one = (data["summary"][arm]["seconds"]["median"] for arm in ("fan-out", "one at a time"))
    return (
        f"the session takes {fan:.2f} s against {one:.2f} s for the same six one at a time "
        f"({one / fan:.1f} times, medians of {data['repeats']}"
    )


def fanout_line(data: dict[str, Any]) -> str:
    """The runtime's fan-out: every sub-agent together against one at a time."""
    together, alone = data["parallel"]["seconds"], data["sequential"]["seconds"]
    return f"finish in {together:.1f} s together against {alone:.1f} s one at a time"


def replay_line(data: dict[str, Any]) -> str:
    finished = data["finished"]
    return f"{finished['runs']:,} finished runs replay in {finished['totalSeconds']:.1f} s"


def forecast_line(data: dict[str, Any]) -> str:
    """The warm forecasts' worst errors: tokens over every scenario, seconds apart for the
    scenarios whose tool calls take a fixed time and the one where each takes a random time (a
    forecast gives the mean; no forecast knows one run's draws)."""

    def worst(key: str, random_tools: bool | None = None) -> float:
        return max(
            abs(r["forecast"][key] - r["actual"][key]) / r["actual"][key]
            for s in data["scenarios"]
            if random_tools is None or isinstance(s["toolSeconds"], str) == random_tools
            for r in s["runs"][1:]
        )

    return (
        f"within {100 * worst('tokens'):.1f} % of its tokens and "
        f"{100 * worst('seconds', False):.0f} % of its time once the runtime had seen the model "
        f"({100 * worst('seconds', True):.0f} % where each tool call took a random 0.5-1.5 s)"
    )


def soak_line(data: dict[str, Any]) -> str:
    """The soak: every run completed while engines were killed."""
    runs, done = data["runs"], data["completed_runs"]
    word = "all" if runs == done else f"{done:,} of"
    return f"an engine killed every 20-40 s completed {word} {runs:,} runs"


def journal_line(data: dict[str, Any]) -> str:
    """The journal's cost per record (p50, one writer) and the replicas' spawn-and-await rate."""
    records, runs = data["records"], data["throughput"]
    taken = data["failover"]["secondsFromKillToTakenOver"]["max"]
    finished = data["failover"]["secondsFromKillToFinished"]["max"]
    return (
        f"A journaled record costs {records['file']['appendMs']['p50']:.2f} ms in the file and "
        f"{records['postgresql']['appendMs']['p50']:.2f} ms in PostgreSQL (p50, one writer); "
        "three replicas on one database spawn and await 60 runs as fast as one runtime on its "
        f"file ({runs['pg-3']['runsPerSecond']:.1f} and {runs['file-1']['runsPerSecond']:.1f} "
        f"runs/s), and with 2 s leases take a killed replica's runs over {taken:.1f} s after "
        f"the kill at most, finished {finished:.1f} s after it at most"
    )


def retention_line(data: dict[str, Any]) -> str:
    """A runtime's start with a million finished runs in its journal, and after retention."""
    before, after = data["before"]["start"], data["after"]["start"]
    return (
        f"A runtime with {data['live']:,} live runs and {data['finished']:,} finished ones in "
        f"its journal started in {before['medianSeconds']:.0f} s "
        f"({before['peakRssMb'] / 1000:.1f} GB); after retention moved the finished ones to "
        f"the archive, in {after['medianSeconds']:.1f} s ({after['peakRssMb']:.0f} MB)"
    )


FIGURES += [
    Figure("sub-agents, the soak", "soak.json", soak_line),
    Figure("runtime retention", "runtime_retention.json", retention_line),
    Figure("runtime retention, the commit", "runtime_retention.json", ran_on_as("retention")),
    Figure("runtime replicas, the journal", "runtime_fleet.json", journal_line),
    Figure(
        "runtime replicas, the commit", "runtime_fleet.json", ran_on_as("the journal and replicas")
    ),
    Figure("sub-agents, Claude Code", "claude_fanout.json", claude_line),
    Figure("sub-agents, the fan-out", "runtime_fanout.json", fanout_line),
    Figure("sub-agents, the replay", "runtime_replay.json", replay_line),
    Figure("sub-agents, the commit", "runtime_fanout.json", ran_on),
    Figure("sub-agents, the forecast", "forecast.json", forecast_line),
    Figure("sub-agents, the forecast's commit", "forecast.json", ran_on),
]
"""The README's figures, each with the result file it cites."""


def _flat(text: str) -> str:
    """`text` with every run of whitespace one space: a figure may wrap across lines."""
    return " ".join(text.split())


def check(readme: str, figures: list[Figure] | None = None) -> list[str]:
    """What the README gets wrong: one line per figure whose rendered text it lacks."""
    wrong = []
    flat = _flat(readme)
    for f in FIGURES if figures is None else figures:
        if not (RESULTS / f.source).exists():
            wrong.append(f"{f.what}: its result file {f.source} is missing")
            continue
        text = f.text()
        if _flat(text) not in flat:
            wrong.append(f"{f.what}: the README should read {text!r} ({f.source})")
    return wrong


def main() -> None:
    readme = README.read_text()
    for f in FIGURES:
        text = f.text() if (RESULTS / f.source).exists() else "(missing)"
        mark = "ok  " if _flat(text) in _flat(readme) else "WRONG"
        print(f"{mark} {f.what} [{f.source}]: {text}")
    wrong = check(readme)
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
