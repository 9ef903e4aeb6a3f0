"""Interactive runs under a batch flood: luftpause against the SGLang router, arm by arm.

Run: `.venv/bin/python -m bench.flood [--pool sim|real] [--window-s 60] [--repeats 2]`.
Every arm starts its own front against two fresh engines with the same parameters and runs the
same closed-loop workload (`luftpause loadgen`) for the same window. Pools:

- sim (default): two engine simulators with a GPU-class profile (GPU_PROFILE), 8 sequences
  each, 48 batch and 4 interactive agents, 8,000-character contexts, up to 3 tool calls per
  run, a 1 s tool, 4x simulated time; rates and durations are reported in simulated time;
- real: two llama.cpp engines serving Gemma 3 270M (bench/real_pool.py), the workload scaled
  down to two CPU cores (POOL_DEFAULTS) with the few-shot preamble a base model needs;
- vllm: two vLLM CPU replicas serving the same model (bench/vllm_pool.py, `make vllm` first),
  one core each, a KV pool of VLLM_KV_TOKENS each, small enough that the agents' contexts press
  it: a real batching engine with a block prefix cache, nobody's model.

Arms:
- sglang-router, cache_aware (pip install sglang-router), the class-blind router people use;
- sglang-router, round_robin;
- luftpause with runs free to move (`scheduler --no-affinity`, an ablation);
- luftpause without engine priority (an ablation; only where the engines have a priority queue);
- luftpause leaving llama.cpp to pick its slots (an ablation; real pool only: the luftpause
  arms there configure `slots: 4`, the engines' --parallel, see common.config);
- luftpause assigning slots but keeping no saved contexts (an ablation; real pool only: the
  luftpause arm there configures `slot_saves: REAL_SLOT_SAVES`);
- luftpause (strict run affinity, the default).

The arms' processes are started by bench.arms.

Each engine's running and waiting requests, KV use and prefix-cache hits are sampled every
0.25 s during each window (bench.engine_watch).
Writes bench/results/flood.json (or flood_<pool>.json, or --out) and prints a Markdown table
(bench.report). Repeats rotate the arms' order (`common.rotated`, the order of each repeat under
"orders") so drift on this noisy machine hits every arm alike; each arm's entry records the
machine's load while it ran (`common.LoadWatch`, under "load").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bench.arms import ARMS, CLIENT_PRIORITY, ENGINE_PRIORITY, start_engines, start_front
from bench.common import RESULTS, LoadWatch, rotated, write_result
from bench.engine_watch import engine_load
from bench.report import flood_table as table
from bench.scheduler_watch import scheduler_view
from luftpause.testkit.loadgen import Workload, run_workload
from luftpause.testkit.stack import SIM_MODEL

# Per pool: the workload and engine settings an argument left unset takes. The real pool is two
# CPU cores serving Gemma 3 270M; its workload is scaled down to what they can serve
# (see bench/real_pool.py), and its time is real (time scale 1).
POOL_DEFAULTS: dict[str, dict[str, Any]] = {
    "sim": {
        "window_s": 60.0,
        "time_scale": 4.0,
        "interactive": 4,
        "batch": 48,
        "context_chars": 8000,
        "tool_calls": 3,
        "max_tokens": 64,
        "engine_priority": True,
        "keep_tools": False,
    },
    "real": {
        "window_s": 240.0,
        "time_scale": 1.0,
        "interactive": 4,
        "batch": 12,
        "context_chars": 3000,
        "tool_calls": 2,
        "max_tokens": 40,
        "engine_priority": False,
        "keep_tools": True,
    },
}
# A vLLM replica's KV pool in the vllm pool: the 28 agents' contexts (about 1,000 tokens and
# their rounds) need some 40k tokens, so the two replicas' 2 x 16k hold about four fifths.
VLLM_KV_TOKENS = 16_384
POOL_DEFAULTS["vllm"] = {
    **POOL_DEFAULTS["real"],
    "window_s": 180.0,
    "batch": 24,
    "context_chars": 4000,
}
# Saved slot contexts per real engine (one per run of the workload: 16 runs over 2 engines;
# each file is about 8 KB per token, some 15 MB for a run's context here).
REAL_SLOT_SAVES = 16
# What a base model needs to call tools, per tool style (see testkit.loadgen and
# bench/real_pool.py): example calls, and a stop after the first call.
REAL_WORKLOAD: dict[str, dict[str, Any]] = {
    style: {"preamble": preamble, "stop": ("</tool_call>",), "temperature": 0.3}
    for style, preamble in (("openai", "gemma"), ("text", "gemma-text"))
}


async def one_arm(arm: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    async with AsyncExitStack() as exits:
        slots = saves = 0
        if args.pool == "real":
            from bench.real_pool import MODEL, PARALLEL, start_real_engines

            parallel = getattr(args, "real_parallel", PARALLEL)
            # The luftpause arms assign the engines' slots unless told to leave them to
            # llama.cpp (its host prompt cache then keeps the contexts it gives away).
            slots = parallel if getattr(args, "real_slots", True) else 0
            model, saves = MODEL, REAL_SLOT_SAVES if slots else 0
            extra = REAL_WORKLOAD[getattr(args, "tool_style", "openai")]
            engines = await start_real_engines(exits, workdir, 2, parallel=parallel)
        elif args.pool == "vllm":
            from bench.vllm_pool import MODEL as VLLM_MODEL
            from bench.vllm_pool import start_vllm_engines

            model = VLLM_MODEL
            extra = REAL_WORKLOAD[getattr(args, "tool_style", "openai")]
            kv = getattr(args, "kv_tokens", None) or VLLM_KV_TOKENS
            engines = await start_vllm_engines(exits, workdir, 2, kv_tokens=kv)
        else:
            model, extra = SIM_MODEL, {}
            engines = await start_engines(exits, workdir, arm, args)
        # The probe period is 2 s of engine time: scaled like everything else simulated.
        front = await start_front(
            exits,
            workdir,
            arm,
            engines,
            model,
            2.0 / args.time_scale,
            engine_priority=args.engine_priority,
            preemptive=getattr(args, "preemptive", True),
            slots=slots,
            slot_saves=saves,
        )
        wl = Workload(
            base_url=front.url + "/v1",
            model=model,
            interactive=args.interactive,
            batch=args.batch,
            context_chars=args.context_chars,
            tool_calls=args.tool_calls,
            tool_seconds=args.tool_seconds / args.time_scale,
            window_s=args.window_s,
            seed=args.seed,
            callers=4,
            max_tokens=args.max_tokens,
            keep_tools=args.keep_tools,
            tool_style=args.tool_style,
            shared_prefix_chars=args.shared_prefix_chars,
            priority=client_priority(arm, args.engine_priority),
            **extra,
        )
        async with engine_load(engines) as load, scheduler_view(front.scheduler) as seen:
            result = await run_workload(wl)
        return {**result["summary"], "engines": load, **({"scheduler": seen} if seen else {})}


def client_priority(arm: str, engine_priority: bool) -> tuple[tuple[str, int], ...]:
    """What the loadgen sends as `priority` in an arm whose clients send it (none otherwise)."""
    if engine_priority and arm.startswith("router-") and arm.endswith(CLIENT_PRIORITY):
        return tuple(sorted(ENGINE_PRIORITY.items()))
    return ()


def _scale(summary: dict[str, Any], time_scale: float) -> dict[str, Any]:
    """Express rates and durations in simulated time (what the engines model)."""
    out: dict[str, Any] = {k: summary[k] for k in ("engines", "scheduler") if k in summary}
    for cls, s in summary.items():
        if cls in ("engines", "scheduler"):
            continue
        out[cls] = {**s, "runs_per_min": round(s["runs_per_min"] / time_scale, 2)}
        for key in ("run_time_p50_s", "run_time_p99_s", "ttft_p50_s", "ttft_p99_s"):
            if s[key] is not None:
                out[cls][key] = round(s[key] * time_scale, 2)
    return out


async def scaled_arm(arm: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """`one_arm` in simulated time, with the machine's load while the arm ran (its start
    included: `common.LoadWatch`)."""
    with LoadWatch() as load:
        summary = _scale(await one_arm(arm, args, workdir), args.time_scale)
    return {**summary, "load": load.summary()}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-flood-"))
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
    orders = [rotated(args.arms, rep) for rep in range(args.repeats)]
    for rep, order in enumerate(orders):
        for arm in order:
            summary = await scaled_arm(arm, args, workdir)
            results[arm].append(summary)
            print(
                f"repeat {rep + 1} {arm}: interactive "
                f"{summary['interactive']['runs_per_min']}/min, batch "
                f"{summary['batch']['runs_per_min']}/min, engines {summary['engines']}",
                flush=True,
            )
    # The arms' order per repeat: the engine logs in `logs` follow it (bench.rereads).
    return {"results": results, "table": table(results), "logs": str(workdir), "orders": orders}


def _earlier(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The result file `--append` adds to; its arguments must match but for the repeats."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"flood: --append: no {path}")
    earlier: dict[str, Any] = json.loads(path.read_text())
    same = {k: v for k, v in vars(args).items() if k not in ("repeats", "append")}
    theirs = {k: v for k, v in earlier["args"].items() if k not in ("repeats", "append")}
    if same != theirs:
        diff = sorted(k for k in same.keys() | theirs.keys() if same.get(k) != theirs.get(k))
        raise SystemExit(f"flood: --append: {path} was run with other arguments: {diff}")
    return earlier


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--pool", choices=sorted(POOL_DEFAULTS), default="sim")
    p.add_argument(
        "--arms",
        nargs="+",
        choices=ARMS,
        help="default: all (but the no-priority ablation where engines have no priority queue)",
    )
    p.add_argument("--window-s", type=float, help="real seconds per arm (sim 60, real 240)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--time-scale", type=float, help="simulated time per real second (sim 4)")
    p.add_argument("--kv-tokens", type=int, default=150000, help="simulator KV pool")
    p.add_argument("--max-running", type=int, default=8, help="simulator batch cap")
    p.add_argument("--interactive", type=int, help="interactive agents (sim 4, real 4)")
    p.add_argument("--batch", type=int, help="batch agents (sim 48, real 12)")
    p.add_argument("--context-chars", type=int, help="characters of context (sim 8000)")
    p.add_argument("--tool-calls", type=int, help="tool calls per run at most (sim 3)")
    p.add_argument("--max-tokens", type=int, help="reply tokens per turn at most (sim 64)")
    p.add_argument(
        "--tool-seconds", type=float, default=1.0, help="seconds a tool call takes (simulated)"
    )
    p.add_argument(
        "--tool-style",
        choices=("openai", "text"),
        default="openai",
        help="tool rounds as OpenAI tool_calls, or as plain messages (a text protocol)",
    )
    p.add_argument("--shared-prefix-chars", type=int, default=0, help="a preamble every run shares")
    p.add_argument(
        "--admission",
        choices=("reserve", "sglang"),
        default="reserve",
        help="simulator admission: whole replies reserved, or SGLang's (a batch up to its KV)",
    )
    p.add_argument("--stream-interval", type=int, default=1, help="simulator tokens per chunk")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--engine-priority",
        action=argparse.BooleanOptionalAction,
        help="engines order their queue by priority; luftpause sends it (sim yes; real: no, "
        "llama.cpp has no priority queue)",
    )
    p.add_argument(
        "--keep-tools",
        action=argparse.BooleanOptionalAction,
        help="offer the tools on every turn, with tool_choice none once a run's calls are spent, "
        "so the prompt's start never changes (sim no, real yes)",
    )
    p.add_argument("--out", help="result name under bench/results (flood, or flood_<pool>)")
    p.add_argument(
        "--append",
        action="store_true",
        help="add these repeats to the result file's (same arguments otherwise)",
    )
    args = p.parse_args()
    for key, value in POOL_DEFAULTS[args.pool].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.pool in ("real", "vllm") and args.engine_priority:
        p.error("--engine-priority: the real pools run without a priority queue")
    if args.arms is None:  # the ablations only where the engines have what they turn off
        args.arms = [
            a
            for a in ARMS
            if (args.engine_priority or a != "luftpause-nopriority")
            and (args.pool == "real" or a not in ("luftpause-noslots", "luftpause-nosaves"))
        ]
    name = args.out or ("flood" if args.pool == "sim" else f"flood_{args.pool}")
    earlier = _earlier(name, args) if args.append else None
    out = asyncio.run(main_async(args))
    if earlier is not None:
        results = {arm: [*earlier["results"][arm], *out["results"][arm]] for arm in args.arms}
        args.repeats += earlier["args"]["repeats"]
        # The earlier runs' provenance, oldest first (files from before it kept their times).
        runs = [*earlier.get("runs", []), earlier["machine"]]
        out = {**out, "results": results, "table": table(results), "runs": runs}
    args.append = False
    path = write_result(name, {"benchmark": name, "args": vars(args), **out})
    print(out["table"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
