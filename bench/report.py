"""The benchmark report: Markdown tables and a PNG plot from the JSON results.

Run: `.venv/bin/python -m bench.report` (the last step of `make bench` and `make bench-real`).
Reads whichever of bench/results/{flood,flood_keep_tools,flood_mcp,flood_real,flood_real_slots,
flood_real_wanted,flood_real_saves,flood_real_shares,overhead}.json exist (with each flood's
unloaded run beside it, `UNLOADED`) and writes bench/results/RESULTS.md and
bench/results/flood.png. The original product's published figures (the seed README, one 8 GB
laptop GPU with SGLang) stand beside ours: a ratio against the class-blind router compares
across test beds, absolute runs/min do not.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.common import RESULTS
from bench.matrix_report import matrix_table
from bench.matrix_report import plot as plot_matrix
from bench.ratelimit_summary import section as ratelimit_section
from bench.scheduler_core import comparison_section

# Flood results and their titles, in report order.
FLOODS = {
    "flood": "Own-loop agents through the dataplane, simulated pool",
    "flood_keep_tools": "Own-loop agents that keep their tools on every turn, through the "
    "dataplane, simulated pool",
    "flood_mcp": "Sub-agents over MCP through the runtime, simulated pool",
    "flood_real": "Own-loop agents through the dataplane, real pool (llama.cpp, Gemma 3 270M)",
    "flood_real_slots": "The real pool with engine slots assigned by the scheduler "
    "(`slots: 4`), against llama.cpp picking them (luftpause-noslots)",
    "flood_real_wanted": "The real pool again, once the scheduler's slot order evicts the "
    "context wanted last",
    "flood_real_saves": "The real pool with saved slot contexts (`slot_saves: 16`), against "
    "the same slots without them (luftpause-nosaves)",
    "flood_real_shares": "The real pool again, luftpause against cache_aware, with the agents' "
    "token counts (their cached share over both classes)",
}
BASELINE = "router-cache_aware"
OURS = "luftpause"

# The seed's published figures: (interactive runs/min per repeat, interactive run time p50 per
# repeat, batch runs/min per repeat). Its baseline is the SGLang router, class-blind.
SEED: dict[str, dict[str, tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]]] = {
    "flood": {
        "router (class-blind)": ((6.0, 6.7), (38.5, 33.6), (83.7, 82.3)),
        "luftpause, runs free to move": ((8.7, 9.0), (23.2, 25.9), (79.3, 79.0)),
        "luftpause": ((12.0, 13.3), (18.5, 19.8), (75.7, 76.0)),
    },
    "flood_mcp": {
        "runtime straight to the router": ((3.0, 3.0), (56.6, 59.5), (39.2, 36.5)),
        "luftpause, runs free to move": ((4.0, 5.0, 4.3, 5.6), (44.4, 36.7), (35.5, 36.6)),
        "luftpause": ((8.0, 8.0), (29.2, 25.2), (36.2, 38.5)),
    },
}
SEED_BASELINE = {"flood": "router (class-blind)", "flood_mcp": "runtime straight to the router"}
# Per flood: the same interactive agents with no batch agents (`--batch 0`). Their rate is the
# most any admission policy can give the interactive runs in the flood.
UNLOADED = {
    "flood": "flood_unloaded",
    "flood_keep_tools": "flood_unloaded_keep_tools",
    "flood_mcp": "flood_mcp_unloaded",
}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _vals(reps: list[dict[str, Any]], cls: str, key: str) -> list[float]:
    return [r[cls][key] for r in reps if r.get(cls, {}).get(key) is not None]


def _fmt(value: float | None) -> str:
    """Three significant digits; whole numbers from 100 up."""
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _pair(reps: list[dict[str, Any]], cls: str, a: str, b: str) -> str:
    return f"{_fmt(_median(_vals(reps, cls, a)))} / {_fmt(_median(_vals(reps, cls, b)))}"


def all_share(rep: dict[str, Any]) -> float | None:
    """One repeat's share of prompt tokens served from cache over both classes, by the agents'
    usage; None for results recorded before the summaries carried token counts.
    """
    classes = [rep.get(cls, {}) for cls in ("interactive", "batch")]
    if any(c.get("prompt_tokens") is None for c in classes):
        return None
    prompt = sum(c["prompt_tokens"] for c in classes)
    return sum(c["cached_tokens"] for c in classes) / prompt if prompt else None


def flood_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """One row per arm; per-repeat rates, medians over repeats for the rest."""
    rows = [
        "| arm | interactive runs/min | interactive run time p50 / p99 (s) | batch runs/min "
        "| TTFT p50 / p99 interactive (s) | TTFT p50 / p99 batch (s) "
        "| cached prompt share: batch / all (agents) "
        "| Jain (callers) | runs moved | engines running / waiting (mean) | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm, reps in results.items():
        ia = " / ".join(_fmt(v) for v in _vals(reps, "interactive", "runs_per_min"))
        ba = " / ".join(_fmt(v) for v in _vals(reps, "batch", "runs_per_min"))
        errors = sum(r[c]["errors"] for r in reps for c in ("interactive", "batch"))
        seen = [r[c].get("runs_moved") for r in reps for c in ("interactive", "batch")]
        known = [v for v in seen if v is not None]
        moved = str(sum(known)) if known else "-"  # the MCP runtime does not see replicas
        rows.append(
            f"| {arm} | {ia} | {_pair(reps, 'interactive', 'run_time_p50_s', 'run_time_p99_s')} "
            f"| {ba} | {_pair(reps, 'interactive', 'ttft_p50_s', 'ttft_p99_s')} "
            f"| {_pair(reps, 'batch', 'ttft_p50_s', 'ttft_p99_s')} "
            f"| {_fmt(_median(_vals(reps, 'batch', 'cached_share')))} / "
            f"{_fmt(_median([v for r in reps if (v := all_share(r)) is not None]))} "
            f"| {_fmt(_median(_vals(reps, 'batch', 'jain_callers')))} | {moved} "
            f"| {_pair(reps, 'engines', 'engine_running_mean', 'engine_waiting_mean')} "
            f"| {errors} |"
        )
    return "\n".join(rows)


def ratios(results: dict[str, list[dict[str, Any]]]) -> dict[str, float] | None:
    """luftpause against cache_aware: interactive runs/min ratio, batch change, p50 ratio."""
    if BASELINE not in results or OURS not in results:
        return None

    def med(arm: str, cls: str, key: str) -> float | None:
        return _median(_vals(results[arm], cls, key))

    base_i, ours_i = (
        med(BASELINE, "interactive", "runs_per_min"),
        med(OURS, "interactive", "runs_per_min"),
    )
    base_b, ours_b = med(BASELINE, "batch", "runs_per_min"), med(OURS, "batch", "runs_per_min")
    base_t, ours_t = (
        med(BASELINE, "interactive", "run_time_p50_s"),
        med(OURS, "interactive", "run_time_p50_s"),
    )
    out: dict[str, float] = {}
    if base_i and ours_i is not None:
        out["interactive_x"] = round(ours_i / base_i, 2)
    if base_b and ours_b is not None:
        out["batch_change"] = round(ours_b / base_b - 1, 3)
    if base_t and ours_t:
        out["run_time_p50_x"] = round(ours_t / base_t, 2)
    return out


def unloaded_line(
    out: str, free: dict[str, list[dict[str, Any]]], flooded: dict[str, list[dict[str, Any]]]
) -> str:
    """The interactive agents alone: their run time and rate, and the ceiling that rate puts
    on the interactive ratio against the baseline in the flood.
    """
    shown = ", ".join(
        f"{arm} {_fmt(_median(_vals(reps, 'interactive', 'run_time_p50_s')))} s "
        f"({_fmt(_median(_vals(reps, 'interactive', 'runs_per_min')))} runs/min)"
        for arm, reps in free.items()
    )
    line = (
        f"The same interactive agents with no batch agents (`--batch 0 --out {out}`): "
        f"interactive run time p50 {shown}."
    )
    alone = _median(_vals(free.get(OURS, []), "interactive", "runs_per_min"))
    base = _median(_vals(flooded.get(BASELINE, []), "interactive", "runs_per_min"))
    if alone and base:
        line += (
            f" No admission can give the interactive runs more than they get alone: at most "
            f"{alone / base:.2f}x `{BASELINE}` in the flood."
        )
    return line


def seed_section(name: str) -> str:
    seed = SEED.get(name)
    if seed is None:
        return ""
    rows = [
        "| seed's arm (laptop GPU, SGLang) | interactive runs/min | interactive run time p50 (s) "
        "| batch runs/min |",
        "| --- | --- | --- | --- |",
    ]
    for arm, (ia, p50, ba) in seed.items():
        rows.append(
            f"| {arm} | {' / '.join(f'{v:g}' for v in ia)} | "
            f"{' / '.join(f'{v:g}' for v in p50)} | {' / '.join(f'{v:g}' for v in ba)} |"
        )
    base = seed[SEED_BASELINE[name]]
    ours = seed["luftpause"]
    ix = statistics.fmean(ours[0]) / statistics.fmean(base[0])
    bx = statistics.fmean(ours[2]) / statistics.fmean(base[2]) - 1
    rows.append("")
    rows.append(f"Seed: interactive {ix:.2f}x the router, batch {bx:+.0%}.")
    return "\n".join(rows)


def flood_section(name: str, data: dict[str, Any]) -> str:
    results = data["results"]
    parts = [f"## {FLOODS[name]}", ""]
    args = data.get("args", {})
    if args:
        shown = ", ".join(f"{k}={v}" for k, v in args.items() if k != "arms")
        parts += [f"Arguments: {shown}. Measured {data.get('machine', {}).get('when', '?')}.", ""]
    parts += [flood_table(results), ""]
    r = ratios(results)
    if r:
        line = (
            f"luftpause against `{BASELINE}`: interactive runs/min {r.get('interactive_x', '-')}x"
        )
        if "batch_change" in r:
            line += f", batch {r['batch_change']:+.1%}"
        if "run_time_p50_x" in r:
            line += f", interactive run time p50 {r['run_time_p50_x']}x"
        parts += [line + ".", ""]
    unloaded = RESULTS / f"{UNLOADED.get(name, '-')}.json"
    if unloaded.exists():
        parts += [
            unloaded_line(UNLOADED[name], json.loads(unloaded.read_text())["results"], results)
        ]
        parts += [""]
    seed = seed_section(name)
    if seed:
        parts += [seed, ""]
    return "\n".join(parts)


def sweep_section(sweeps: list[dict[str, Any]]) -> str:
    """How the gain and its cost move with the engine's batch cap (one file per cap)."""
    rows = [
        "## The trade-off against the engine's batch cap (simulated pool)",
        "",
        "Each row is one `python -m bench.flood --arms router-cache_aware luftpause "
        "--max-running N --out flood_sweep_N` run; the rest of the workload as above.",
        "",
        "| engine batch cap | interactive runs/min, luftpause / cache_aware | interactive x "
        "| batch runs/min, luftpause / cache_aware | batch change "
        "| engines running, luftpause / cache_aware (mean) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for data in sorted(sweeps, key=lambda d: d["args"]["max_running"]):
        res = data["results"]
        r = ratios(res) or {}

        def med(arm: str, cls: str, key: str, res: dict[str, Any] = res) -> str:
            return _fmt(_median(_vals(res.get(arm, []), cls, key)))

        rows.append(
            f"| {data['args']['max_running']} "
            f"| {med(OURS, 'interactive', 'runs_per_min')} / "
            f"{med(BASELINE, 'interactive', 'runs_per_min')} | {r.get('interactive_x', '-')}x "
            f"| {med(OURS, 'batch', 'runs_per_min')} / {med(BASELINE, 'batch', 'runs_per_min')} "
            f"| {r.get('batch_change', 0):+.1%} "
            f"| {med(OURS, 'engines', 'engine_running_mean')} / "
            f"{med(BASELINE, 'engines', 'engine_running_mean')} |"
        )
    return "\n".join(rows) + "\n"


def plot(floods: dict[str, dict[str, Any]], path: Path) -> None:
    """Per flood: interactive runs/min, interactive run time p50 and batch runs/min by arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = (
        ("interactive", "runs_per_min", "interactive runs/min"),
        ("interactive", "run_time_p50_s", "interactive run time p50 (s)"),
        ("batch", "runs_per_min", "batch runs/min"),
    )
    fig, axes = plt.subplots(
        len(metrics), len(floods), figsize=(4.6 * len(floods), 9), squeeze=False
    )
    for col, (name, data) in enumerate(floods.items()):
        arms = list(data["results"])
        for row, (cls, key, label) in enumerate(metrics):
            ax = axes[row][col]
            meds, lows, highs = [], [], []
            for arm in arms:
                vals = _vals(data["results"][arm], cls, key) or [0.0]
                m = statistics.median(vals)
                meds.append(m)
                lows.append(m - min(vals))
                highs.append(max(vals) - m)
            colors = ["#1f77b4" if a.startswith("luftpause") else "#999999" for a in arms]
            ax.bar(range(len(arms)), meds, yerr=[lows, highs], color=colors, capsize=3)
            ax.set_xticks(range(len(arms)))
            ax.set_xticklabels([a.replace("router-", "router\n") for a in arms], fontsize=7)
            ax.set_ylabel(label, fontsize=8)
            if row == 0:
                ax.set_title(name.replace("_", " "), fontsize=9)
    fig.suptitle("Batch flood: median over repeats, bars show min..max", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_floods() -> dict[str, dict[str, Any]]:
    return {
        name: json.loads((RESULTS / f"{name}.json").read_text())
        for name in FLOODS
        if (RESULTS / f"{name}.json").exists()
    }


def matrix_section(data: dict[str, Any]) -> str:
    """The workload matrix: its table, how to read it, and its figure."""
    return "\n".join(
        [
            "## Workload matrix (`python -m bench.matrix`)",
            "",
            "Every cell against fresh engines, arms side by side: median over repeats "
            "(min..max). Cells: engine `kv` (batches up to its KV pool, as SGLang) or `slots` "
            "(8 requests at most) or `real` (llama.cpp, 2 slots each); tool rounds as OpenAI "
            "`tool_calls` or as plain messages (`text`); contexts `unique` or with a `shared` "
            "preamble; KV that `fits` the runs' contexts or in which they `thrash`. Cached is "
            "the share of prompt tokens from cache (both classes). *Interactive alone* is the "
            "interactive agents with no batch agents: the most any admission could give them, "
            "and in brackets that rate over cache_aware's, the ceiling of the interactive "
            "target. See bench/matrix.py for the workload.",
            "",
            matrix_table(data["cells"]),
            "",
            "![luftpause over cache_aware per cell](matrix.png)",
            "",
        ]
    )


def render(floods: dict[str, dict[str, Any]]) -> str:
    """RESULTS.md's text from the result files."""
    parts = [
        "# Benchmark results",
        "",
        "Generated by `python -m bench.report` from the JSON files beside this one; do not edit.",
        "",
    ]
    matrix = RESULTS / "matrix.json"
    if matrix.exists():
        parts.append(matrix_section(json.loads(matrix.read_text())))
    for name, data in floods.items():
        parts.append(flood_section(name, data))
    sweeps = [json.loads(f.read_text()) for f in sorted(RESULTS.glob("flood_sweep_*.json"))]
    if sweeps:
        parts.append(sweep_section(sweeps))
    overhead = RESULTS / "overhead.json"
    if overhead.exists():
        data = json.loads(overhead.read_text())
        if data.get("table"):
            parts += ["## Proxy overhead (instant-reply engine, kept-alive connections)", ""]
            parts += [data["table"], ""]
    deployed = RESULTS / "overhead_deploy.json"
    if deployed.exists():
        data = json.loads(deployed.read_text())
        if data.get("table"):
            parts += [
                "## Proxy overhead as deployed: tracing on, two workers (no peers)",
                "",
                "The same benchmark without the peers, with the `dataplane-traced` arm (scheduler "
                "and dataplane exporting every span to an OTLP receiver) and `dataplane-2workers`.",
                "",
                data["table"],
                "",
            ]
    ttfb = RESULTS / "router_ttfb.json"
    if ttfb.exists():
        data = json.loads(ttfb.read_text())
        parts += [
            "## sglang-router's time to first byte, one suspect varied per arm",
            "",
            "One request at a time on a connection of its own (`python -m bench.router_ttfb`, "
            f"commit {data['machine']['commit'][:10]}): median over rounds (min..max) of each "
            "round's p50 and p90, in ms; added over the direct arm of the same kind; the "
            "TCP_NODELAY the server's accepted socket had before any change; ACKs the kernel "
            "sent on its delayed-ACK timer per request. See bench/router_ttfb.py for the arms.",
            "",
            data["table"],
            "",
        ]
    core = RESULTS / "scheduler_core_against.json"
    if core.exists():
        parts.append(comparison_section(json.loads(core.read_text())))
    limited, stress = RESULTS / "ratelimit_realtime.json", RESULTS / "ratelimit_stress.json"
    if limited.exists():
        also = json.loads(stress.read_text()) if stress.exists() else None
        parts.append(ratelimit_section(json.loads(limited.read_text()), also))
    return "\n".join(parts)


def main() -> None:
    floods = load_floods()
    out = RESULTS / "RESULTS.md"
    out.write_text(render(floods))
    print(f"wrote {out}")
    if floods:
        png = RESULTS / "flood.png"
        plot(floods, png)
        print(f"wrote {png}")
    matrix = RESULTS / "matrix.json"
    if matrix.exists():
        png = RESULTS / "matrix.png"
        plot_matrix(json.loads(matrix.read_text())["cells"], png)
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
