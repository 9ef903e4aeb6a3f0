"""Placement on engines nobody here tuned: luftpause against the best router arm on engine models
drawn at random from the simulator's family, side by side.

Run: `.venv/bin/python -m bench.family [--models 30] [--seed 26] [--named issue-sglang ...]`.
Each engine model (bench.engine_models: SGLang-, vLLM- and llama.cpp-like engines on small and
large GPUs, sampled, plus the named ones) runs two fresh simulators with its flags, and each arm
runs the matrix's workload against them (48 batch and 4 interactive closed-loop agents, up to 3
tool calls of 2 s, ~2,500-token contexts, 300 simulated seconds at `--time-scale` 10), tool rounds
as OpenAI tool calls or as plain messages (drawn per model, or `--style`). The arms, their order
rotated from model to model:

- `router-cache_aware`: sglang-router's cache_aware policy with its defaults, the best router
  arm: a client of sglang-router 0.3.2 cannot send the engine a priority (the router drops the
  field, bench.router_fields), so cache_aware is what a router user runs;
- `luftpause`: every rule on, the engine's `priority` sent where the engine has a priority queue
  (preempting where it preempts).

For each model the result keeps both arms' runs/min and cached share per class, each engine's
load (bench.engine_watch), what luftpause's scheduler saw (bench.scheduler_watch), the machine's
load while the arm ran (`common.LoadWatch`; real processes only), and the ratios luftpause /
router. The summary gives the distribution of the ratios and every model where
luftpause is behind: on batch by more than 10 %, or on both classes. `--lab` runs the same in
bench.pool_lab's virtual time instead of real processes (about a minute per model, no sockets,
`--jobs` models side by side; deterministic, so the machine's load does not move it): the same
scheduler core and dataplane placement driven by a discrete-event model of the engines and
agents. The lab also counts turns answered per class (`ratio_turns`, `summary_turns`): a run
lasts a minute or more, so runs finished in a 300 s window move in jumps of a whole run per
agent. `--without RULE,...` turns rules off in the luftpause arm (an ablation, lab only) and
`--only NAME...` keeps some of the models (each with the tool style the full draw gave it).
Writes bench/results/family.json (or `--out`) after every model, each with the provenance of
the run that measured it (`common.provenance`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import RESULTS, provenance, rotated, write_result
from bench.engine_models import NAMED, EngineModel, sampled
from bench.flood import scaled_arm
from bench.pool_lab import LabFront, LabWorkload, run_lab
from luftpause.scheduler.core.model import Rules

ARMS = ("router-cache_aware", "luftpause")
ROUTER = "router-cache_aware"
BEHIND_BATCH = 0.9


def workload_args(model: EngineModel, style: str, a: argparse.Namespace) -> argparse.Namespace:
    """bench.flood's arguments for one engine model (the matrix's simulated workload)."""
    return argparse.Namespace(
        pool="sim",
        window_s=a.window_s / a.time_scale,
        time_scale=a.time_scale,
        interactive=4,
        batch=48,
        context_chars=10_000,
        shared_prefix_chars=0,
        tool_calls=3,
        tool_seconds=2.0,
        max_tokens=64,
        # The model's flags carry its queue order; luftpause sends priority where it has one.
        engine_priority=model.priority,
        preemptive=model.params.preempt_threshold is not None,
        keep_tools=style == "openai",
        tool_style=style,
        seed=a.seed,
        kv_tokens=model.params.kv_tokens,
        max_running=model.params.max_running,
        admission=model.params.admission,
        stream_interval=4,
        engine_flags=model.flags(),
    )


def lab_arm(model: EngineModel, arm: str, style: str, a: argparse.Namespace) -> dict[str, Any]:
    wl = LabWorkload(
        tool_style=style, keep_tools=style == "openai", window_s=a.window_s, seed=a.seed
    )
    if arm == ROUTER:
        front = LabFront(kind="cache_aware")
    else:
        rules = Rules(interactive_weight=a.interactive_weight).switched(a.without, on=False)
        front = LabFront(kind="luftpause", priority=model.priority, rules=rules)
    return run_lab(model.lab(), wl, front)


def ratios(
    arms: dict[str, dict[str, Any]], measure: str = "runs_per_min"
) -> dict[str, float | None]:
    """luftpause / router per class (runs per minute, or another per-class `measure`)."""
    out: dict[str, float | None] = {}
    for cls in ("interactive", "batch"):
        ours = arms["luftpause"][cls].get(measure)
        theirs = arms[ROUTER][cls].get(measure)
        out[cls] = round(ours / theirs, 3) if theirs and ours is not None else None
    return out


def behind(r: dict[str, float | None]) -> bool:
    """Behind on batch by more than 10 %, or behind on both classes."""
    i, b = r["interactive"], r["batch"]
    if b is None or i is None:
        return False
    return b < BEHIND_BATCH or (b < 1.0 and i < 1.0)


def behind_beyond_noise(r: dict[str, float | None], se: dict[str, float | None]) -> bool:
    """Behind (see `behind`) by more than chance over the seeds explains: every shortfall
    that makes it behind is more than twice its standard error (`seed_error`)."""
    if not behind(r):
        return False
    i, b = r["interactive"], r["batch"]
    si, sb = se.get("interactive"), se.get("batch")
    if b is None or i is None or si is None or sb is None:
        return True
    if b < BEHIND_BATCH - 2 * sb:
        return True
    return b < 1.0 - 2 * sb and i < 1.0 - 2 * si


def summarise(models: list[dict[str, Any]], key: str = "ratio") -> dict[str, Any]:
    """The distribution of the ratios (`key`: by runs, or `ratio_turns`: by turns answered),
    the models behind, and the worst one."""
    rows = [m for m in models if key in m and m[key]["batch"] is not None]
    if not rows:
        return {}

    def spread(cls: str) -> dict[str, float]:
        vals = sorted(float(m[key][cls]) for m in rows if m[key][cls] is not None)
        if not vals:
            return {}
        # Inclusive: between the smallest and largest even for a handful of models.
        qs = [vals[0]] * 9
        if len(vals) > 1:
            qs = statistics.quantiles(vals, n=10, method="inclusive")
        return {
            "min": vals[0],
            "p10": round(qs[0], 3),
            "median": round(statistics.median(vals), 3),
            "p90": round(qs[-1], 3),
            "max": vals[-1],
        }

    lagging = [m["name"] for m in rows if behind(m[key])]
    worst = min(rows, key=lambda m: (m[key]["batch"], m[key]["interactive"] or 0.0))
    out: dict[str, Any] = {
        "models": len(rows),
        "interactive": spread("interactive"),
        "batch": spread("batch"),
        "behind": lagging,
        "worst": worst["name"],
    }
    if key == "ratio" and all("ratio_se" in m for m in rows):
        # Pooled over seeds: of those behind, the ones chance over the seeds does not explain.
        out["behind_beyond_noise"] = [
            m["name"]
            for m in rows
            if m["name"] in lagging and behind_beyond_noise(m[key], m["ratio_se"])
        ]
    return out


def table(models: list[dict[str, Any]]) -> str:
    """One Markdown row per model: the engine, both arms, the ratios."""
    lines = [
        "| model | engine | tools | router: inter / batch, cached | luftpause | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in models:
        p = m["engine"]
        engine = (
            f"{p['admission']}, {p['prefix_cache']}/{p['block_size']}, "
            f"{p['chunked_prefill']} {p['chunk_tokens']}, KV {p['kv_tokens'] // 1000}k, "
            f"{p['max_running']} running, {p['prefill_ms_per_token']} ms/tok"
        )
        arms = m["arms"]
        cells = []
        for arm in (ROUTER, "luftpause"):
            s = arms[arm]
            cells.append(
                f"{s['interactive']['runs_per_min']} / {s['batch']['runs_per_min']}, "
                f"{round(100 * (s['batch']['cached_share'] or 0))} %"
            )
        r = m["ratio"]
        flag = " (behind)" if behind(r) else ""
        se = m.get("ratio_se") or {}
        if se.get("interactive") is not None and se.get("batch") is not None:
            flag = f" ± {se['interactive']} / {se['batch']}{flag}"
        lines.append(
            f"| {m['name']} | {engine} | {m['style']} | {cells[0]} | {cells[1]} | "
            f"{r['interactive']} / {r['batch']}{flag} |"
        )
    return "\n".join(lines)


def chosen_models(a: argparse.Namespace) -> list[tuple[EngineModel, str]]:
    """The engine models to run, each with its tool style (drawn with `--style-seed`, by
    default the workload's seed)."""
    style_seed = a.seed if getattr(a, "style_seed", None) is None else a.style_seed
    rng = random.Random(f"style-{style_seed}")
    out: list[tuple[EngineModel, str]] = []
    for name in a.named:
        out.append((NAMED[name], a.style or "openai"))
    for m in sampled(a.sampler_seed, a.models):
        out.append((m, a.style or rng.choice(("openai", "text"))))
    if a.only:
        out = [(m, st) for m, st in out if m.name in a.only]
    return out


def lab_arms(job: tuple[EngineModel, str, int, argparse.Namespace]) -> dict[str, Any]:
    """Both arms of one model in the lab (a worker process's job)."""
    model, style, i, a = job
    return {arm: lab_arm(model, arm, style, a) for arm in rotated(list(ARMS), i)}


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-family-"))
    models: list[dict[str, Any]] = []
    chosen = chosen_models(a)
    if a.resume:  # keep the models the result file has, run the rest
        path = RESULTS / f"{a.out}.json"
        models = json.loads(path.read_text())["models"] if path.exists() else []
        done = {(m["name"], m["style"]) for m in models}
        chosen = [(m, st) for m, st in chosen if (m.name, st) not in done]
    labbed: Iterator[dict[str, Any]] = iter(())
    if a.lab:  # virtual time: deterministic, so models may run side by side
        pool = ProcessPoolExecutor(a.jobs, max_tasks_per_child=1)
        labbed = pool.map(lab_arms, [(m, st, i, a) for i, (m, st) in enumerate(chosen)])
    for i, (model, style) in enumerate(chosen):
        args = workload_args(model, style, a)
        arms: dict[str, dict[str, Any]] = {}
        if a.lab:
            arms = next(labbed)
        else:
            for arm in rotated(list(ARMS), i):
                arms[arm] = await scaled_arm(arm, args, workdir)
        ratio = ratios(arms)
        row: dict[str, Any] = {
            "name": model.name,
            "family": model.family,
            "style": style,
            "engine": model.describe(),
            "flags": model.flags(),
            "arms": arms,
            "ratio": ratio,
            "provenance": provenance(),  # `--resume` keeps models an earlier run measured
        }
        if all("turns_per_min" in arms[arm]["batch"] for arm in ARMS):
            row["ratio_turns"] = ratios(arms, "turns_per_min")
        models.append(row)
        print(
            f"{model.name} ({style}): interactive {ratio['interactive']}, batch "
            f"{ratio['batch']}{'  BEHIND' if behind(ratio) else ''}",
            flush=True,
        )
        payload = {
            "benchmark": "family",
            "lab": a.lab,
            "args": vars(a),
            "models": models,
            "summary": summarise(models),
            "summary_turns": summarise(models, "ratio_turns"),
            "table": table(models),
            "logs": str(workdir),
        }
        write_result(a.out, payload)
    return payload


POOLED = ("runs_per_min", "turns_per_min", "cached_share")


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from the same models run at several workload seeds: per model and arm, each
    class's runs and turns per minute and cached share averaged over the seeds, the ratios of
    those means, and each seed's own ratios (`by_seed`). A window of 300 s finishes a few runs
    per agent, so one seed's ratio moves in whole runs; the mean over seeds is the finer one."""
    seeds = [r["args"]["seed"] for r in runs]
    by_model: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        for m in r["models"]:
            by_model.setdefault((m["name"], m["style"]), []).append(m)
    models = []
    for (name, style), rows in by_model.items():
        if len(rows) != len(runs):
            raise ValueError(f"{name} ({style}) is not in every run: pool runs of one draw")
        arms: dict[str, dict[str, Any]] = {}
        for arm in ARMS:
            arms[arm] = {}
            for cls in ("interactive", "batch"):
                means: dict[str, float | None] = {}
                for measure in POOLED:
                    vals = [row["arms"][arm][cls].get(measure) for row in rows]
                    got = [float(v) for v in vals if v is not None]
                    means[measure] = round(statistics.fmean(got), 4) if got else None
                arms[arm][cls] = means
        row = {k: rows[0][k] for k in ("name", "family", "style", "engine", "flags")}
        row |= {
            "arms": arms,
            "ratio": ratios(arms),
            "ratio_turns": ratios(arms, "turns_per_min"),
            "ratio_se": seed_error([m["ratio"] for m in rows]),
            "by_seed": {
                str(seed): {"ratio": m["ratio"], "ratio_turns": m.get("ratio_turns")}
                for seed, m in zip(seeds, rows, strict=True)
            },
        }
        models.append(row)
    return {
        "benchmark": "family",
        "lab": all(r.get("lab") for r in runs),
        "seeds": seeds,
        "pooled_from": [r.get("file", "") for r in runs],
        "models": models,
        "summary": summarise(models),
        "summary_turns": summarise(models, "ratio_turns"),
        "summary_by_seed": {
            str(seed): summarise(r["models"]) for seed, r in zip(seeds, runs, strict=True)
        },
        "table": table(models),
    }


def seed_error(per_seed: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Per class, the standard error of a model's ratio over the seeds (their standard
    deviation over the square root of their count; None with fewer than two): how far the
    mean over seeds can move by chance, the yardstick for a model a hair behind."""
    out: dict[str, float | None] = {}
    for cls in ("interactive", "batch"):
        vals = [v for r in per_seed if (v := r.get(cls)) is not None]
        out[cls] = round(statistics.stdev(vals) / len(vals) ** 0.5, 3) if len(vals) > 1 else None
    return out


def pool_files(names: list[str], out: str) -> dict[str, Any]:
    """`pooled` over result files of bench/results (names without .json)."""
    runs = []
    for name in names:
        run = json.loads((RESULTS / f"{name}.json").read_text())
        runs.append(run | {"file": f"{name}.json"})
    payload = pooled(runs)
    write_result(out, payload)
    return payload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", type=int, default=30, help="engine models to sample")
    p.add_argument("--sampler-seed", type=int, default=26, help="seed of the engine sampler")
    p.add_argument(
        "--named",
        nargs="*",
        default=sorted(NAMED),
        choices=sorted(NAMED),
        help="named engine models run first (default: all)",
    )
    p.add_argument("--style", choices=("openai", "text"), help="tool style (default: drawn)")
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--window-s", type=float, default=300.0, help="simulated seconds per arm")
    p.add_argument("--seed", type=int, default=1, help="the workload's seed")
    p.add_argument(
        "--style-seed",
        type=int,
        help="the seed of each model's tool style draw (default: the workload's seed): give "
        "runs at other workload seeds the same styles",
    )
    p.add_argument(
        "--pool",
        nargs="+",
        metavar="RESULT",
        help="no run: pool these result files (bench/results/NAME.json, one draw at several "
        "workload seeds) into --out",
    )
    p.add_argument("--lab", action="store_true", help="virtual time (bench.pool_lab), no sockets")
    p.add_argument("--only", nargs="+", help="of the models named and sampled, only these")
    p.add_argument(
        "--without",
        type=lambda v: tuple(v.split(",")),
        default=(),
        help=f"--lab only: luftpause with these rules off (an ablation): {','.join(Rules.names())}",
    )
    p.add_argument(
        "--interactive-weight",
        type=float,
        default=Rules().interactive_weight,
        help="--lab only: luftpause's interactive weight (the share rule; default %(default)s)",
    )
    p.add_argument("--resume", action="store_true", help="keep the models --out already has")
    p.add_argument("--jobs", type=int, default=2, help="models side by side (--lab only)")
    p.add_argument("--out", default="family")
    a = p.parse_args()
    if a.lab and a.out == "family":
        a.out = "family_lab"
    if a.pool:
        out = pool_files(a.pool, a.out)
        print(out["table"])
        print(json.dumps(out["summary"], indent=2))
        return
    out = asyncio.run(main_async(a))
    print(out["table"])
    print(json.dumps(out["summary"], indent=2))
    print(f"wrote {RESULTS / (a.out + '.json')}")


if __name__ == "__main__":
    main()
