"""Decision-core throughput and how it grows with live runs; Resync of a large dataplane.

Run: `.venv/bin/python -m bench.scheduler_core [--runs 1000 10000 100000] [--events 100000]
[--against REF] [--out NAME]`.
One process, one core, no I/O: `decide()` alone, 32 replicas, 16 callers. Two pools: engines
with room (no queue reported, so uncapped), and saturated engines, each capped at 48 turns (its
engine reports a queue), so that with more runs than slots turns are held and drained as slots
free, which is where a scheduler earns its keep. The event mix is closed-loop agent traffic:
a turn ends (half of them in tool calls), its run's next turn is admitted; every 1,000 events
each replica is probed and the clock ticks. Writes bench/results/scheduler_core.json.

`--against REF` measures the core of another commit (a git ref) beside this one: its tree is
checked out into a temporary git worktree, and every trial runs in a fresh process (the
trial's seed its hash seed, so both trees of a trial run the same workload), this tree's and the
other's alternated, their order rotated from trial to trial (new, old, old, new,
...), so both see the same machine; each trial records the machine's load while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench.common import LoadWatch, rotated, write_result
from luftpause.common.config import Endpoint
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.events import (
    Admit,
    Event,
    Place,
    ProbeResult,
    Resync,
    RunSnapshot,
    Tick,
    TurnFinished,
    TurnSnapshot,
)
from luftpause.scheduler.core.model import Phase, ServiceClass
from luftpause.scheduler.core.state import State

REPLICAS = 32
SLOTS_PER_REPLICA = 48
CALLERS = 16


def pool(saturated: bool = True) -> State:
    endpoints = [
        Endpoint(id=f"r{i}", url=f"http://r{i}:1", models=frozenset({"m"})) for i in range(REPLICAS)
    ]
    state = initial_state(endpoints)
    for i in range(REPLICAS):
        state, _ = decide(state, _probe(i, 0.0, saturated))
    return state


def _probe(i: int, at: float, saturated: bool) -> ProbeResult:
    """A queueing engine (capped at what it runs) when saturated, else one with room."""
    waiting = 1 + (int(at) % 3) if saturated else 0
    return ProbeResult(
        at=at, replica_id=f"r{i}", healthy=True, running=SLOTS_PER_REPLICA, waiting=waiting
    )


class Workload:
    """Closed-loop agents: every run always has exactly one turn admitted (placed or held)."""

    def __init__(self, runs: int, seed: int, saturated: bool) -> None:
        self.saturated = saturated
        self.rng = random.Random(seed)
        self.runs = runs
        self.turn_no = 0
        self.at = 1.0
        self.in_flight: deque[str] = deque()
        self.run_of: dict[str, str] = {}

    def admit(self, run: str) -> Admit:
        self.turn_no += 1
        tid = f"t{self.turn_no}"
        self.run_of[tid] = run
        cls = ServiceClass.BATCH if hash(run) % 4 else ServiceClass.INTERACTIVE
        return Admit(
            at=self.at,
            turn_id=tid,
            run_id=run,
            model="m",
            service_class=cls,
            caller=f"c{int(run[3:]) % CALLERS}",
        )

    def placed(self, actions: tuple[Any, ...]) -> None:
        self.in_flight.extend(a.turn_id for a in actions if isinstance(a, Place))

    def next_events(self, n: int) -> list[Event]:
        """Finish the oldest turn in flight and admit that run's next one."""
        tid = self.in_flight.popleft()
        self.at += 0.001
        events: list[Event] = [
            TurnFinished(at=self.at, turn_id=tid, tool_calls=self.rng.random() < 0.5),
            self.admit(self.run_of.pop(tid)),
        ]
        if n % 1000 == 0:
            events += [_probe(i, self.at, self.saturated) for i in range(REPLICAS)]
            events.append(Tick(at=self.at))
        return events


def measure(runs: int, events: int, seed: int, saturated: bool = True) -> dict[str, Any]:
    # The collector as the scheduler process sets it (`luftpause.scheduler.collector`), where
    # the tree measured has that module; older trees ran with Python's default.
    try:
        from luftpause.scheduler import collector
    except ImportError:
        tuned = False
    else:
        collector.tune()
        tuned = True
    state = pool(saturated)
    work = Workload(runs, seed, saturated)
    for r in range(runs):  # fill: every run has a turn admitted
        state, actions = decide(state, work.admit(f"run{r}"))
        work.placed(actions)
    done = 0
    t0 = time.process_time()
    n = 0
    while done < events:
        n += 1
        for ev in work.next_events(n):
            state, actions = decide(state, ev)
            work.placed(actions)
            done += 1
    elapsed = time.process_time() - t0
    return {
        "runs": runs,
        "saturated": saturated,
        "events": done,
        "cpu_s": round(elapsed, 3),
        "events_per_s": round(done / elapsed),
        "us_per_event": round(1e6 * elapsed / done, 2),
        "held_at_end": len(state.held),
        "in_flight_at_end": len(state.turns),
        "collector": "scheduler's" if tuned else "default",
    }


ROOT = Path(__file__).resolve().parents[1]


def import_path(tree: Path) -> str:
    """PYTHONPATH that makes `tree`'s luftpause and bench the ones imported (before the venv's)."""
    services = sorted((tree / "services").glob("*"))
    parts = [tree, *services, tree / "proto", tree / "testkit", tree / "src"]
    return os.pathsep.join(str(p) for p in parts if p.is_dir())


def measure_in(tree: Path, runs: int, events: int, seed: int, saturated: bool) -> dict[str, Any]:
    """`measure` in a fresh process importing the code of `tree` (checked: the process says
    where its decision core came from)."""
    # The venv's own copy of the package must not win over `tree`'s: a regular package found
    # later on the path beats namespace portions found first (older trees had those).
    other = "" if tree == ROOT else str(ROOT / "src")
    code = (
        f"import json, sys; sys.path[:] = [p for p in sys.path if p != {other!r}]; "
        "import luftpause.scheduler.core.decide as core; print(core.__file__); "
        "from bench.scheduler_core import measure; "
        f"print(json.dumps(measure({runs}, {events}, {seed}, {saturated})))"
    )
    # The workload's classes come from `hash(run)`: the same hash seed gives both trees of a
    # trial the same runs (a random one gave each process its own mix, one more spread).
    env = {**os.environ, "PYTHONPATH": import_path(tree), "PYTHONHASHSEED": str(seed)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"trial in {tree} failed:\n{out.stderr[-2000:]}")
    where, result_line = out.stdout.strip().splitlines()[-2:]
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"trial for {tree} imported the core from {where}")
    result: dict[str, Any] = json.loads(result_line)
    return result


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [t["events_per_s"] for t in trials]
    loads = [t["load"] for t in trials if "load" in t]
    return {
        **{k: v for k, v in trials[0].items() if k != "load"},
        **({"load": loads} if loads else {}),
        "events_per_s": round(statistics.median(rates)),
        "events_per_s_min": min(rates),
        "events_per_s_max": max(rates),
        "us_per_event": round(1e6 / statistics.median(rates), 2),
        "held_at_end": trials[0]["held_at_end"],
    }


def compare(ref: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """This tree against `ref`, trial by trial alternated, each in its own process."""
    sha = subprocess.run(
        ["git", "rev-parse", ref], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="luftpause-core-") as tmp:
        old = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(old), sha],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            for saturated in (False, True):
                for runs in args.runs:
                    trials: dict[str, list[dict[str, Any]]] = {"new": [], "old": []}
                    trees = {"new": ROOT, "old": old}
                    for k in range(args.repeats):
                        for arm in rotated(list(trees), k):
                            with LoadWatch() as load:
                                got = measure_in(
                                    trees[arm], runs, args.events, args.seed + k, saturated
                                )
                            trials[arm].append({**got, "load": load.summary()})
                    new, was = summary(trials["new"]), summary(trials["old"])
                    row = {
                        "runs": runs,
                        "saturated": saturated,
                        "new": new,
                        "old": was,
                        "ratio": round(new["events_per_s"] / was["events_per_s"], 2),
                    }
                    rows.append(row)
                    print(
                        f"{'saturated' if saturated else 'room':>9} {runs:>7} runs: "
                        f"new {new['events_per_s']:>7} ({new['events_per_s_min']}.."
                        f"{new['events_per_s_max']}), old {was['events_per_s']:>7} "
                        f"({was['events_per_s_min']}..{was['events_per_s_max']}) events/s, "
                        f"{row['ratio']}x",
                        flush=True,
                    )
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True
            )
    return [{"against": sha, "rows": rows}]


def _rate(arm: dict[str, Any]) -> str:
    return f"{arm['events_per_s']:,} ({arm['events_per_s_min']:,}..{arm['events_per_s_max']:,})"


def comparison_section(data: dict[str, Any]) -> str:
    """The decision core against an earlier commit, trials alternated in fresh processes."""
    rows = [
        "| engines | live runs | this commit, events/s | earlier commit, events/s | ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for comparison in data["comparison"]:
        for row in comparison["rows"]:
            engines = "saturated" if row["saturated"] else "with room"
            new, old = _rate(row["new"]), _rate(row["old"])
            rows.append(f"| {engines} | {row['runs']:,} | {new} | {old} | {row['ratio']}x |")
    against = ", ".join(c["against"][:10] for c in data["comparison"])
    return "\n".join(
        [
            "## Scheduler decision core, against an earlier commit",
            "",
            f"`python -m bench.scheduler_core --against {against}`: `decide()` alone on one core, "
            f"{data['replicas']} replicas, {data['events']:,} events per trial, {data['repeats']} "
            "trials per arm, the two commits alternated in fresh processes; median (min..max).",
            "",
            *rows,
            "",
        ]
    )


def resync_cost(runs: int) -> dict[str, Any]:
    """One dataplane reporting `runs` runs (a fifth of them with a turn in flight)."""
    state = pool()
    snaps = tuple(
        RunSnapshot(
            run_id=f"run{i}",
            replica=f"r{i % REPLICAS}",
            phase=Phase.TOOL_PAUSED if i % 2 else Phase.IDLE,
            service_class=ServiceClass.INTERACTIVE,
            caller=f"c{i % CALLERS}",
            idle_seconds=1.0,
        )
        for i in range(runs)
    )
    turns = tuple(
        TurnSnapshot(
            turn_id=f"t{i}",
            run_id=f"run{i}",
            replica=f"r{i % REPLICAS}",
            model="m",
            service_class=ServiceClass.BATCH,
            caller=f"c{i % CALLERS}",
        )
        for i in range(0, runs, 5)
    )
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        decide(state, Resync(at=10.0, dataplane="dp", runs=snaps, turns=turns))
        samples.append(time.perf_counter() - t0)
    return {
        "runs": runs,
        "turns": len(turns),
        "decide_ms_median": round(1000 * statistics.median(samples), 1),
        "decide_ms_max": round(1000 * max(samples), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, nargs="+", default=[1000, 10000, 100000])
    p.add_argument("--events", type=int, default=100000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--against", metavar="REF", help="also measure this commit, alternated")
    p.add_argument(
        "--out",
        metavar="NAME",
        help="write bench/results/NAME.json (default: scheduler_core, or scheduler_core_against "
        "with --against)",
    )
    args = p.parse_args()
    if args.against:
        comparison = compare(args.against, args)
        path = write_result(
            args.out or "scheduler_core_against",
            {
                "benchmark": "scheduler_core_against",
                "replicas": REPLICAS,
                "slots_per_replica": SLOTS_PER_REPLICA,
                "callers": CALLERS,
                "events": args.events,
                "repeats": args.repeats,
                "comparison": comparison,
            },
        )
        print(f"wrote {path}")
        return
    rows = []
    for saturated in (False, True):
        for runs in args.runs:
            trials = [
                measure(runs, args.events, args.seed + k, saturated) for k in range(args.repeats)
            ]
            row = summary(trials)
            rows.append(row)
            print(
                f"{'saturated' if saturated else 'room':>9} {runs:>7} runs: "
                f"{row['events_per_s']:>7} events/s "
                f"({row['events_per_s_min']}..{row['events_per_s_max']}), "
                f"{row['held_at_end']} held, {row['in_flight_at_end']} in flight",
                flush=True,
            )
    resync = resync_cost(10000)
    print(
        f"resync of {resync['runs']} runs + {resync['turns']} turns in decide(): "
        f"{resync['decide_ms_median']} ms",
        flush=True,
    )
    path = write_result(
        args.out or "scheduler_core",
        {
            "benchmark": "scheduler_core",
            "replicas": REPLICAS,
            "slots_per_replica": SLOTS_PER_REPLICA,
            "callers": CALLERS,
            "throughput": rows,
            "resync": resync,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
