"""Interactive sub-agents under a batch flood, through the MCP runtime: bench.flood's arms with
the runtime between the load and the front.

Run: `.venv/bin/python -m bench.flood_mcp [--window-s 60] [--repeats 2] [--time-scale 4]`.
Per arm and repeat, all fresh: two engine simulators (bench.flood's GPU-class profile, each run
scripted to make `--tool-calls` tool calls), the arm's front (bench.arms.start_front), fake-mcp
with `lookup` taking 1 s of simulated time, and a runtime whose dataplane is that front. Against
an sglang-router arm that is "the runtime straight to the router" (the router ignores the
run/class/caller headers); in the router arm whose clients send `priority`
(`router-cache_aware-priority`) the runtime puts its run's class's engine priority in every
turn's body (`--send-priority`), as the loadgen does in bench.flood. The load
(`luftpause.testkit.mcp_loadgen`): 48 batch and 4 interactive agents over 4 MCP sessions, each
spawning a sub-agent on an 8,000-character task with `lookup` and at most 3 tool calls, awaiting
it, and spawning the next.

Also measured per arm: CPU seconds per window second of the runtime, fake-mcp and this process
(the MCP clients), and the whole machine's busy share, since 52 sub-agents on 2 cores can make
the runtime the bottleneck. Writes bench/results/flood_mcp.json and prints a Markdown table; rates
and durations are in simulated time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bench.arms import ARMS, start_engines, start_front
from bench.common import LoadWatch, rotated, write_result
from bench.engine_watch import engine_load
from bench.flood import _scale, client_priority
from luftpause.testkit.mcp_loadgen import McpWorkload, run_mcp_workload
from luftpause.testkit.stack import SIM_MODEL, start_runtime

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


async def one_arm(arm: str, rep: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    name = f"{arm}-r{rep}"
    async with AsyncExitStack() as exits:
        engines = await start_engines(
            exits, workdir, name, args, "--tool-rounds", str(args.tool_calls)
        )
        # The probe period is 2 s of engine time: scaled like everything else simulated.
        arm_front = await start_front(
            exits,
            workdir,
            arm,
            engines,
            SIM_MODEL,
            2.0 / args.time_scale,
            engine_priority=args.engine_priority,
        )
        front = arm_front.url
        sent = client_priority(arm, args.engine_priority)
        env = {"LUFTPAUSE_SEND_PRIORITY": ",".join(f"{c}={n}" for c, n in sent)} if sent else None
        rt = await start_runtime(
            exits,
            workdir,
            front,
            name=name,
            tool_seconds=1.0 / args.time_scale,
            model=SIM_MODEL,
            env=env,
        )
        url, runtime, fake = rt.mcp_url, rt.runtime, rt.fake_mcp
        wl = McpWorkload(
            url=url,
            interactive=args.interactive,
            batch=args.batch,
            context_chars=args.context_chars,
            tool_calls=args.tool_calls,
            window_s=args.window_s,
            seed=args.seed + rep,
            callers=args.callers,
            model=SIM_MODEL,
        )
        before = (_proc_cpu(runtime.pid), _proc_cpu(fake.pid), _self_cpu(), _machine_cpu())
        t0 = time.monotonic()
        async with engine_load(engines) as load:
            result = await run_mcp_workload(wl)
        seconds = time.monotonic() - t0
        after = (_proc_cpu(runtime.pid), _proc_cpu(fake.pid), _self_cpu(), _machine_cpu())
    busy = after[3][0] - before[3][0]
    total = after[3][1] - before[3][1]
    cpu = {
        "runtime_cores": round((after[0] - before[0]) / seconds, 3),
        "fake_mcp_cores": round((after[1] - before[1]) / seconds, 3),
        "loadgen_cores": round((after[2] - before[2]) / seconds, 3),
        "machine_busy_share": round(busy / total, 3) if total else None,
        "cpus": os.cpu_count(),
    }
    scaled = _scale({**result["summary"], "engines": load}, args.time_scale)
    return {**scaled, "cpu": cpu}


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """bench.flood's table without what the runtime does not expose (TTFT, cached share), with
    the runtime's CPU use per repeat.
    """
    rows = [
        "| arm | interactive runs/min | interactive run time p50 / p99 (s) | batch runs/min "
        "| Jain (batch callers) | errors | runtime cores | machine busy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm, reps in results.items():

        def med(cls: str, key: str, reps: list[dict[str, Any]] = reps) -> str:
            vals = [r[cls][key] for r in reps if r[cls][key] is not None]
            return f"{statistics.median(vals):g}" if vals else "-"

        def each(get: Callable[[dict[str, Any]], Any], reps: list[dict[str, Any]] = reps) -> str:
            return " / ".join(str(get(r)) for r in reps)

        errors = sum(r[c]["errors"] for r in reps for c in ("interactive", "batch"))
        rows.append(
            f"| {arm} | {each(lambda r: r['interactive']['runs_per_min'])} | "
            f"{med('interactive', 'run_time_p50_s')} / {med('interactive', 'run_time_p99_s')} | "
            f"{each(lambda r: r['batch']['runs_per_min'])} | {med('batch', 'jain_callers')} | "
            f"{errors} | {each(lambda r: r['cpu']['runtime_cores'])} | "
            f"{each(lambda r: r['cpu']['machine_busy_share'])} |"
        )
    return "\n".join(rows)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-flood-mcp-"))
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
    for rep in range(args.repeats):
        for arm in rotated(args.arms, rep):
            with LoadWatch() as load:
                out = await one_arm(arm, rep, args, workdir)
            out["load"] = load.summary()
            results[arm].append(out)
            print(
                f"repeat {rep + 1} {arm}: interactive {out['interactive']['runs_per_min']}/min, "
                f"batch {out['batch']['runs_per_min']}/min, errors "
                f"{out['interactive']['errors'] + out['batch']['errors']}, runtime "
                f"{out['cpu']['runtime_cores']} cores",
                flush=True,
            )
    return {
        "results": results,
        "table": table(results),
        "logs": str(workdir),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument(
        "--arms",
        nargs="+",
        # simulators have no slots
        default=[a for a in ARMS if a not in ("luftpause-noslots", "luftpause-nosaves")],
        choices=ARMS,
    )
    p.add_argument("--window-s", type=float, default=60.0, help="real seconds per arm")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--time-scale", type=float, default=4.0)
    p.add_argument("--kv-tokens", type=int, default=150000)
    p.add_argument("--max-running", type=int, default=8, help="engine batch cap")
    p.add_argument("--interactive", type=int, default=4)
    p.add_argument("--batch", type=int, default=48)
    p.add_argument("--callers", type=int, default=4, help="MCP sessions the agents share")
    p.add_argument("--context-chars", type=int, default=8000)
    p.add_argument("--tool-calls", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--engine-priority",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engines order their queue by priority; luftpause sends it (see bench.flood)",
    )
    p.add_argument("--out", default="flood_mcp", help="result name under bench/results")
    args = p.parse_args()
    out = asyncio.run(main_async(args))
    path = write_result(args.out, {"benchmark": args.out, "args": vars(args), **out})
    print(out["table"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
