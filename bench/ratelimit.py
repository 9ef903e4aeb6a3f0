"""Hosted APIs under rate limits: agents straight at the provider, through LiteLLM, through
luftpause, side by side.

Run: `.venv/bin/python -m bench.ratelimit [--seeds 0 1 2 3 4] [--scenarios ...] [--quick]`.
Each scenario (`ratelimit_plan.SCENARIOS`: one or two simulated providers, fixed or continuous
refill, OpenAI or Anthropic headers) runs every seed; each seed runs every arm against fresh
simulators with the same limits and the same agents (`ratelimit_plan.plan_agents`), the arms'
order rotated per seed. The arms (`ratelimit_arms`): `direct` (the openai client's own
retries, which honour `retry-after-ms` and `Retry-After`), `litellm` (the LiteLLM proxy with
the providers' rpm/tpm per real minute in its deployments, usage-based-routing-v2) and
`luftpause` (scheduler and dataplane; limits learned from the reply headers, or also stated in
the endpoint file with `--stated-limits`).

A measurement starts at a window boundary with zeroed simulators (`ratelimit_arms.align`) and
ends when the last agent has its final answer; every run is bounded (`--bound-x` times the
ideal schedule, plus two minutes). Figures: `ratelimit_summary`. Writes
bench/results/ratelimit.json (or `--out`) after every seed, prints the table, and puts its
section into bench/results/RESULTS.md (not with `--quick` or `--no-report`).

`--quick`: seed 0 of `fixed-openai` with 4 agents at time scale 20 (about 45 s for all three
arms), written to ratelimit_quick.json. `--append` keeps the file's other scenarios (run
`--scenarios fixed-openai-minute --append` to add LiteLLM's own granularity); `--render` only
summarises the file again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench.common import RESULTS, write_result
from bench.ratelimit_agents import Client, Turn, run_agent
from bench.ratelimit_arms import align, counts, limits_of, start_front, start_providers
from bench.ratelimit_plan import (
    ARMS,
    DEFAULT_SCENARIOS,
    SCENARIOS,
    Scenario,
    plan_agents,
    quick,
    rough_tokens,
)
from bench.ratelimit_summary import TurnFacts, describe, measure, put_section, section, summarise
from bench.ratelimit_summary import table as summary_table
from luftpause.testkit.stack import SIM_MODEL, Launcher


def arm_order(index: int, arms: tuple[str, ...] = ARMS) -> list[str]:
    """The arms of the `index`-th seed: rotated by one per seed."""
    k = index % len(arms)
    return [*arms[k:], *arms[:k]]


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
    """One arm of one seed against fresh providers; its figures."""
    plans = plan_agents(seed, scenario.agents, scenario.shape)
    async with AsyncExitStack() as exits, aiohttp.ClientSession() as session:
        launcher = Launcher(workdir / f"{scenario.name}-s{seed}-{arm}", exits)
        launcher.workdir.mkdir(parents=True, exist_ok=True)
        endpoints = await start_providers(launcher, scenario)
        urls = await start_front(arm, launcher, scenario, endpoints, stated=args.stated_limits)
        clients = [[Client(u) for u in urls] for _ in plans]
        for c in clients:
            exits.push_async_callback(_close, c)
        await align(session, scenario, [e.url for e in endpoints])
        t0 = time.perf_counter()
        bound = args.bound_x * rough_ideal_s(scenario, seed) + 120.0
        async with asyncio.timeout(bound):
            turns = await asyncio.gather(
                *(
                    run_agent(
                        plan,
                        clients[i],
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
        tallies = {e.id: counts(await limits_of(session, e.url)) for e in endpoints}
    return measure(
        [facts(t) for agent in turns for t in agent],
        tallies,
        wall_s=wall,
        providers=scenario.providers,
        window_real_s=scenario.window_real_s,
        regime=scenario.regime,
    )


async def _close(clients: list[Client]) -> None:
    for c in clients:
        await c.close()


async def run(args: argparse.Namespace, save: bool = True) -> dict[str, Any]:
    """Every scenario and seed; the result (written after every seed when `save`)."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-ratelimit-"))
    earlier = RESULTS / f"{args.out}.json"
    kept = json.loads(earlier.read_text())["scenarios"] if args.append and earlier.exists() else {}
    result: dict[str, Any] = {
        "benchmark": "ratelimit",
        "stated_limits": args.stated_limits,
        "quick": args.quick,
        "workdir": str(workdir),
        "scenarios": {k: v for k, v in kept.items() if k not in args.scenarios},
    }
    for name in args.scenarios:
        scenario = quick(SCENARIOS[name]) if args.quick else SCENARIOS[name]
        entry: dict[str, Any] = {"description": describe(scenario), "seeds": []}
        result["scenarios"][name] = entry
        for index, seed in enumerate(args.seeds):
            arms: dict[str, Any] = {}
            order = [a for a in arm_order(index) if a in args.arms]
            for arm in order:
                arms[arm] = await one_arm(scenario, arm, seed, workdir, args)
                shown = {k: arms[arm][k] for k in ("provider_429s", "wall_s", "wall_over_ideal")}
                print(f"{name} seed {seed} {arm}: {json.dumps(shown)}", flush=True)
            entry["seeds"].append({"seed": seed, "order": order, "arms": arms})
            entry["summary"] = summarise([s["arms"] for s in entry["seeds"]])
            if save:
                write_result(args.out, result)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 3 4")
    p.add_argument("--scenarios", nargs="+", choices=tuple(SCENARIOS), default=None)
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--quick", action="store_true", help="seed 0, 4 agents, time scale 20")
    p.add_argument(
        "--stated-limits",
        action="store_true",
        help="the luftpause endpoint file states each provider's limits (default: headers only)",
    )
    p.add_argument("--bound-x", type=float, default=6.0, help="a run's bound, x the ideal")
    p.add_argument("--out", default=None, help="result name under bench/results/")
    p.add_argument("--no-report", action="store_true", help="leave RESULTS.md alone")
    p.add_argument(
        "--append",
        action="store_true",
        help="keep the result file's other scenarios (a scenario run again replaces its own)",
    )
    p.add_argument(
        "--render",
        action="store_true",
        help="run nothing: summarise the result file again and rewrite the table and section",
    )
    args = p.parse_args(argv)
    if args.seeds is None:
        args.seeds = [0] if args.quick else [0, 1, 2, 3, 4]
    if args.scenarios is None:
        args.scenarios = ["fixed-openai"] if args.quick else list(DEFAULT_SCENARIOS)
    if args.out is None:
        args.out = "ratelimit_quick" if args.quick else "ratelimit"
    return args


def rerender(result: dict[str, Any]) -> dict[str, Any]:
    """The result with each scenario's description and summary made again from its seeds."""
    for name, entry in result["scenarios"].items():
        scenario = quick(SCENARIOS[name]) if result.get("quick") else SCENARIOS[name]
        entry["description"] = describe(scenario)
        for seed in entry["seeds"]:
            for m in seed["arms"].values():  # figures recorded before wall / earliest was one
                if m.get("earliest_s") and "wall_over_earliest" not in m:
                    m["wall_over_earliest"] = m["wall_s"] / m["earliest_s"]
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
        data = json.loads(path.read_text())
        beside = RESULTS / "ratelimit_stated.json"
        stated = (
            json.loads(beside.read_text()) if args.out == "ratelimit" and beside.exists() else None
        )
        md.write_text(put_section(md.read_text() if md.exists() else "", section(data, stated)))
        print(f"wrote its section into {md}")


if __name__ == "__main__":
    main()
