"""Hosted APIs under rate limits: agents straight at the provider, through LiteLLM, through
luftpause, side by side, in real time.

Run: `.venv/bin/python -m bench.ratelimit [--seeds 0 1] [--scenarios ...] [--quick|--stress]`.
Each scenario (`ratelimit_plan.SCENARIOS`: one or two simulated providers, fixed or continuous
refill, OpenAI or Anthropic headers; by default the real-time ones, windows of a real minute)
runs every seed; each seed runs every arm against fresh simulators with the same limits and
the same agents (`ratelimit_plan.plan_agents`), the arms' order rotated per seed
(`bench.common.rotated`). The arms (`ratelimit_plan.ARM_ABOUT`, `ratelimit_arms`): `direct`
(the openai package's defaults), `direct-patient` (30 retries), `litellm` (the proxy as its
docs set up rate-limited deployments), `luftpause` (endpoints without `limits`) and
`luftpause-limits` (`limits: {}`, or with `--stated-limits` the limits stated).

The scenarios run side by side (each its own seeds and arms in order; `--one-at-a-time` runs
them one after another): a run is the providers' windows of a real minute, the machine mostly
idle meanwhile; each arm records the machine's load while it ran (`LoadWatch`). A measurement
starts at the same point of a fixed window for every arm with zeroed simulators
(`ratelimit_arms.align`) and ends when the last agent has its final answer; every run is bounded
(`--bound-x` times the ideal schedule, plus two minutes). Figures: `ratelimit_summary`. Writes
bench/results/ratelimit_realtime.json (`--stress`: ratelimit_stress.json; or `--out`) after
every seed of every scenario, with each arm's front configuration (LiteLLM's config, the
endpoint file), prints the table, and puts its section into bench/results/RESULTS.md (not with
`--quick` or `--no-report`).

`--quick`: seed 0 of `fixed-openai` with 4 agents at time scale 20 (windows of 3 s; about two
minutes for all five arms), written to ratelimit_quick.json. `--append` keeps the file's other
scenarios; `--render` only summarises the file again. `--no-new-seed-after-min` bounds a run's
length: a scenario starts no further seed after that many minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench.common import RESULTS, LoadWatch, provenance, rotated, write_result
from bench.ratelimit_agents import BudgetSplit, Client, Turn, run_agent
from bench.ratelimit_arms import (
    align,
    align_phase_s,
    counts,
    limits_of,
    planned_providers,
    start_arm,
)
from bench.ratelimit_plan import (
    ARMS,
    DEFAULT_SCENARIOS,
    LITELLM_ROUTER,
    SCENARIOS,
    STRESS_SCENARIOS,
    Scenario,
    budget_weights,
    client_retries,
    plan_agents,
    quick,
    rough_tokens,
)
from bench.ratelimit_summary import TurnFacts, describe, measure, put_section, section, summarise
from bench.ratelimit_summary import table as summary_table
from luftpause.testkit.stack import SIM_MODEL, Launcher


def rough_ideal_s(scenario: Scenario, seed: int) -> float:
    """About the ideal schedule of a seed, from the plans (for the run's bound)."""
    total = sum(rough_tokens(p) for p in plan_agents(seed, scenario.agents, scenario.shape))
    rate = sum(p.limit("tpm") or p.limit("itpm") or 0 for p in scenario.providers)
    return total / rate * scenario.window_real_s if rate else 60.0


def facts(turn: Turn) -> TurnFacts:
    return TurnFacts(
        ok=turn.ok,
        latency_s=turn.latency_s,
        ttfb_s=turn.ttfb_s,
        prompt_tokens=turn.prompt_tokens,
        completion_tokens=turn.completion_tokens,
        provider=turn.provider,
        refused_seen=turn.refused_seen,
        errors=len(turn.errors),
        error_kinds=tuple(turn.errors),
    )


async def one_arm(
    scenario: Scenario, arm: str, seed: int, workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One arm of one seed against fresh providers; its figures, its front's configuration and
    the machine's load while it ran."""
    plans = plan_agents(seed, scenario.agents, scenario.shape)
    async with AsyncExitStack() as exits, aiohttp.ClientSession() as session:
        launcher = Launcher(workdir / f"{scenario.name}-s{seed}-{arm}", exits)
        launcher.workdir.mkdir(parents=True, exist_ok=True)
        planned = planned_providers(scenario)
        stated = args.stated_limits
        urls, config = await start_arm(arm, launcher, scenario, planned, stated=stated)
        retries = client_retries(arm)
        clients = [[Client(u, max_retries=retries) for u in urls] for _ in plans]
        for c in clients:
            exits.push_async_callback(_close, c)
        split = BudgetSplit(budget_weights(scenario.providers)) if len(urls) > 1 else None
        with LoadWatch() as load:
            waited = await align(session, scenario, [e.url for e in planned])
            t0 = time.perf_counter()
            bound = args.bound_x * rough_ideal_s(scenario, seed) + 120.0
            async with asyncio.timeout(bound):
                turns = await asyncio.gather(
                    *(
                        run_agent(
                            plan,
                            clients[i],
                            split,
                            model=SIM_MODEL,
                            seed=seed,
                            time_scale=scenario.time_scale,
                            max_tokens=scenario.shape.max_tokens,
                            t0=t0,
                        )
                        for i, plan in enumerate(plans)
                    )
                )
            wall = time.perf_counter() - t0
            tallies = {e.id: counts(await limits_of(session, e.url)) for e in planned}
    figures = measure(
        [facts(t) for agent in turns for t in agent],
        tallies,
        wall_s=wall,
        providers=scenario.providers,
        window_real_s=scenario.window_real_s,
        regime=scenario.regime,
        phase_s=align_phase_s(scenario),
    )
    front = {"client_max_retries": retries, **config}
    if split is not None:
        front["split_weights"] = list(split.weights)
    return {**figures, "align_wait_s": round(waited, 2), "load": load.summary(), "front": front}


async def _close(clients: list[Client]) -> None:
    for c in clients:
        await c.close()


async def one_scenario(
    name: str,
    args: argparse.Namespace,
    workdir: Path,
    entry: dict[str, Any],
    save: Callable[[], None],
    offset: int = 0,
) -> None:
    """Every seed of one scenario, the arms' order rotated per seed (and by `offset`, so that
    scenarios running side by side run different arms at a time); `save()` after each arm.
    An arm that fails or overruns its bound is recorded as failed, and the run goes on. A seed
    the entry already has (`--fill`) runs only its arms that are missing or failed, marked as
    run again."""
    scenario = quick(SCENARIOS[name]) if args.quick else SCENARIOS[name]
    for index, seed in enumerate(args.seeds):
        if index and args.seed_deadline is not None and time.monotonic() > args.seed_deadline:
            entry["seeds_not_started"] = args.seeds[index:]
            print(f"{name}: past --no-new-seed-after-min, seeds {args.seeds[index:]} not run")
            break
        known = next((s for s in entry["seeds"] if s["seed"] == seed), None)
        if known is None:
            order = [a for a in rotated(ARMS, index + offset) if a in args.arms]
            known = {"seed": seed, "order": order, "arms": {}}
            entry["seeds"].append(known)
        arms: dict[str, Any] = known["arms"]
        for arm in [a for a in known["order"] if a in args.arms and _wanted(arms.get(a))]:
            again = arm in arms
            try:
                arms[arm] = await one_arm(scenario, arm, seed, workdir, args)
            except Exception as exc:  # recorded in the result: one arm's failure is a figure
                arms[arm] = {"failed": f"{type(exc).__name__}: {exc}"}
                print(f"{name} seed {seed} {arm}: failed: {exc!r}", flush=True)
            else:
                shown = {k: arms[arm][k] for k in ("turns_done", "provider_429s", "errors")}
                print(f"{name} seed {seed} {arm}: {json.dumps(shown)}", flush=True)
            if again:
                arms[arm]["run_again"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            entry["summary"] = summarise([s["arms"] for s in entry["seeds"]])
            save()


def _wanted(arm: dict[str, Any] | None) -> bool:
    """An arm a seed still needs: never run, or failed."""
    return arm is None or "failed" in arm


async def run(args: argparse.Namespace, save: bool = True) -> dict[str, Any]:
    """Every scenario and seed; the result (written after every arm when `save`). With
    `--fill`, the result file's seeds are kept and only their missing or failed arms run."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-ratelimit-"))
    earlier = RESULTS / f"{args.out}.json"
    before = json.loads(earlier.read_text()) if earlier.exists() else {}
    kept = before.get("scenarios", {}) if args.append or args.fill else {}
    result: dict[str, Any] = {
        "benchmark": "ratelimit",
        "stated_limits": args.stated_limits,
        "quick": args.quick,
        "concurrent_scenarios": not args.one_at_a_time,
        "litellm_router": LITELLM_ROUTER,
        "workdir": str(workdir),
        "scenarios": {k: v for k, v in kept.items() if args.fill or k not in args.scenarios},
    }
    if args.fill and before:  # the run that made the file stays its provenance
        result["machine"] = before["machine"]
        result["fills"] = [*before.get("fills", []), provenance()]
    entries: dict[str, dict[str, Any]] = {}
    for name in args.scenarios:
        scenario = quick(SCENARIOS[name]) if args.quick else SCENARIOS[name]
        fresh = {"description": describe(scenario), "seeds": []}
        entries[name] = result["scenarios"].setdefault(name, fresh)

    def saved() -> None:
        if save:
            write_result(args.out, result)

    if args.one_at_a_time:
        for name in args.scenarios:
            await one_scenario(name, args, workdir, entries[name], saved)
    else:
        await asyncio.gather(
            *(
                one_scenario(name, args, workdir, entries[name], saved, offset=k)
                for k, name in enumerate(args.scenarios)
            )
        )
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1")
    p.add_argument("--scenarios", nargs="+", choices=tuple(SCENARIOS), default=None)
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--quick", action="store_true", help="seed 0, 4 agents, time scale 20")
    p.add_argument(
        "--stress",
        action="store_true",
        help="the time-scaled stress scenarios (10-second windows) instead of the real-time ones",
    )
    p.add_argument("--one-at-a-time", action="store_true", help="the scenarios one after another")
    p.add_argument(
        "--stated-limits",
        action="store_true",
        help="luftpause-limits states each provider's limits (default: `limits: {}`)",
    )
    p.add_argument("--bound-x", type=float, default=6.0, help="a run's bound, x the ideal")
    p.add_argument(
        "--no-new-seed-after-min",
        type=float,
        default=None,
        help="a scenario starts no further seed this many minutes after the run began",
    )
    p.add_argument("--out", default=None, help="result name under bench/results/")
    p.add_argument("--no-report", action="store_true", help="leave RESULTS.md alone")
    p.add_argument(
        "--append",
        action="store_true",
        help="keep the result file's other scenarios (a scenario run again replaces its own)",
    )
    p.add_argument(
        "--fill",
        action="store_true",
        help="keep the result file and run only the arms its seeds miss or that failed",
    )
    p.add_argument(
        "--render",
        action="store_true",
        help="run nothing: summarise the result file again and rewrite the table and section",
    )
    args = p.parse_args(argv)
    minutes = args.no_new_seed_after_min
    args.seed_deadline = None if minutes is None else time.monotonic() + 60.0 * minutes
    if args.seeds is None:
        args.seeds = [0] if args.quick else [0, 1]
    if args.scenarios is None:
        chosen = STRESS_SCENARIOS if args.stress else DEFAULT_SCENARIOS
        args.scenarios = ["fixed-openai"] if args.quick else list(chosen)
    if args.out is None:
        args.out = (
            "ratelimit_quick"
            if args.quick
            else "ratelimit_stress"
            if args.stress
            else "ratelimit_realtime"
        )
    return args


def rerender(result: dict[str, Any]) -> dict[str, Any]:
    """The result with each scenario's description and summary made again from its seeds."""
    for name, entry in result["scenarios"].items():
        scenario = quick(SCENARIOS[name]) if result.get("quick") else SCENARIOS[name]
        entry["description"] = describe(scenario)
        entry["summary"] = summarise([s["arms"] for s in entry["seeds"]])
    return result


def main() -> None:
    args = parse_args()
    if args.render:
        path = RESULTS / f"{args.out}.json"
        result = rerender(json.loads(path.read_text()))
        path.write_text(json.dumps(result, indent=2) + "\n")
    else:
        result = uvloop.run(run(args))
        path = write_result(args.out, result)
    print(summary_table(result["scenarios"]))
    print(f"wrote {path}")
    if not (args.quick or args.no_report):
        md = RESULTS / "RESULTS.md"
        real = RESULTS / "ratelimit_realtime.json"
        stress = RESULTS / "ratelimit_stress.json"
        if real.exists():
            text = section(
                json.loads(real.read_text()),
                json.loads(stress.read_text()) if stress.exists() else None,
            )
            md.write_text(put_section(md.read_text() if md.exists() else "", text))
            print(f"wrote its section into {md}")


if __name__ == "__main__":
    main()
