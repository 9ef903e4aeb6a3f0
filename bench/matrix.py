"""The workload matrix: luftpause against sglang-router's policies in every regime, side by side.

Run: `.venv/bin/python -m bench.matrix [--cells sim|real|all|NAME...] [--repeats 3]`.
A cell is an engine, a style of tool round, a kind of context and a KV size:

- engine `kv`: two simulators that batch up to their KV pool as SGLang does (`--admission
  sglang`, up to 48 running requests); `slots`: two that run at most 8 requests and reserve
  whole replies (today's bench engine); `real`: two llama.cpp servers serving Gemma 3 270M,
  2 slots each (bench/real_pool.py); `vllm`: two vLLM CPU replicas serving the same model, a KV
  pool of 16k tokens each (bench/vllm_pool.py, `make vllm` first; 24 batch and 4 interactive
  agents, ~1,000-token contexts);
- tools `openai`: tool rounds as OpenAI `tool_calls`, tools offered on every turn; `text`: a
  text protocol, the call written in the reply and its result sent back as a user message, so
  every turn ends without tool calls;
- context `unique`: every run's 10,000 characters are its own; `shared`: the first 4,000 are a
  preamble all runs share;
- kv `fits`: the runs' contexts fit the engines' KV pools (96k tokens, 150k for `slots`);
  `thrash`: a 36k-token pool, about a third of what the runs on a replica hold (the active
  working set is 2-3x the pool).

Every cell runs each arm (router cache_aware, router round_robin, luftpause) against fresh
engines with the same workload (48 batch and 4 interactive closed-loop agents, up to 3 tool
calls of 2 s, 300 simulated seconds; the real cells 6 batch and 2 interactive agents, 180 s),
their order rotated from repeat to repeat (`common.rotated`), each with the machine's load while
it ran (`common.LoadWatch`, under "load"), then once more luftpause with the interactive agents
alone (no batch agents): their rate then is the most any admission policy could give them in
the flood, the ceiling of the interactive target. The simulated cells run `--time-scale` times
faster than real time; rates and durations are reported in simulated time. Each arm's result
also records how far the simulators fell behind their schedule (`sim_lag_mean_s`,
`sim_lag_max_s`), so a cell run on a machine too busy to keep up shows it. Writes
bench/results/matrix.json (or `--out`) after every cell; `--append` adds the repeats to cells
already in the file, and a cell listed again replaces its earlier result. Each cell keeps the
provenance of every run that measured it (`common.provenance`: commit, command, versions).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.arms import ARMS as ALL_ARMS
from bench.common import RESULTS, provenance, rotated, write_result
from bench.flood import VLLM_KV_TOKENS, scaled_arm
from bench.matrix_report import ablation_table, matrix_table

ARMS = ("router-cache_aware", "luftpause")
ALONE = "interactive-alone"
ENGINES = ("kv", "slots", "real", "vllm")
REAL_ENGINES = ("real", "vllm")
TOOLS = ("openai", "text")
CONTEXTS = ("unique", "shared")
KVS = ("fits", "thrash")
CONTEXT_CHARS = 10_000
SHARED_CHARS = 4_000
KV_TOKENS = {("kv", "fits"): 96_000, ("slots", "fits"): 150_000, "thrash": 36_000}


@dataclass(frozen=True, slots=True)
class Cell:
    engine: str
    tools: str
    context: str = "unique"
    kv: str = "fits"

    @property
    def name(self) -> str:
        if self.engine in REAL_ENGINES:
            return f"{self.engine}-{self.tools}"
        return f"{self.engine}-{self.tools}-{self.context}-{self.kv}"

    @classmethod
    def parse(cls, name: str) -> Cell:
        parts = name.split("-")
        cell = cls(*parts) if len(parts) in (2, 4) else None
        if cell is None or cell.name != name or not cell.valid:
            raise ValueError(f"unknown cell {name!r}")
        return cell

    @property
    def valid(self) -> bool:
        return (
            self.engine in ENGINES
            and self.tools in TOOLS
            and self.context in CONTEXTS
            and self.kv in KVS
            and (self.engine not in REAL_ENGINES or (self.context, self.kv) == ("unique", "fits"))
        )


def all_cells(which: str) -> list[Cell]:
    """The simulated cells, the real ones, or both."""
    sim = [
        Cell(engine, tools, context, kv)
        for engine in ("kv", "slots")
        for kv in KVS
        for tools in TOOLS
        for context in CONTEXTS
    ]
    real = [Cell(engine, tools) for engine in REAL_ENGINES for tools in TOOLS]
    return {"sim": sim, "real": real, "all": [*sim, *real]}[which]


def _real_args(cell: Cell, a: argparse.Namespace, **pool: Any) -> argparse.Namespace:
    """A real pool's cell: real time, plain few-shot tool rounds, no engine priority."""
    return argparse.Namespace(
        pool=cell.engine,
        window_s=a.real_window_s,
        time_scale=1.0,
        shared_prefix_chars=0,
        tool_calls=2,
        tool_seconds=2.0,
        max_tokens=40,
        engine_priority=False,
        keep_tools=cell.tools == "openai",
        tool_style=cell.tools,
        seed=a.seed,
        **pool,
    )


def cell_args(cell: Cell, a: argparse.Namespace) -> argparse.Namespace:
    """bench.flood's arguments for one cell."""
    if cell.engine == "vllm":
        # The issue's own measurement: 24 batch and 4 interactive agents, ~1,000-token contexts.
        return _real_args(
            cell, a, interactive=4, batch=24, context_chars=4000, kv_tokens=VLLM_KV_TOKENS
        )
    if cell.engine == "real":
        # llama.cpp picks the slots (real_slots off): naming them cost cached prompt tokens with
        # plain-message agents (bench/results/matrix_slots.json), gained nothing with tool calls.
        return _real_args(
            cell, a, interactive=2, batch=6, context_chars=3000, real_parallel=2, real_slots=False
        )
    kv = KV_TOKENS.get((cell.engine, cell.kv)) or KV_TOKENS["thrash"]
    shared = SHARED_CHARS if cell.context == "shared" else 0
    return argparse.Namespace(
        pool="sim",
        window_s=300.0 / a.time_scale,
        time_scale=a.time_scale,
        interactive=4,
        batch=48,
        context_chars=CONTEXT_CHARS - shared,
        shared_prefix_chars=shared,
        tool_calls=3,
        tool_seconds=2.0,
        max_tokens=64,
        engine_priority=True,
        keep_tools=cell.tools == "openai",
        tool_style=cell.tools,
        seed=a.seed,
        kv_tokens=kv,
        max_running=48 if cell.engine == "kv" else 8,
        admission="sglang" if cell.engine == "kv" else "reserve",
        stream_interval=4,
    )


async def run_cell(cell: Cell, a: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    args = cell_args(cell, a)
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in a.arms}
    for rep in range(a.repeats):
        for arm in rotated(a.arms, rep):
            summary = await scaled_arm(arm, args, workdir)
            results[arm].append(summary)
            print(
                f"{cell.name} repeat {rep + 1} {arm}: interactive "
                f"{summary['interactive']['runs_per_min']}/min, batch "
                f"{summary['batch']['runs_per_min']}/min, cached "
                f"{summary['batch']['cached_share']}, engines {summary['engines']}",
                flush=True,
            )
    if a.alone:
        # The interactive agents with no batch at all: the most any admission can give them.
        alone = argparse.Namespace(**{**vars(args), "batch": 0})
        summary = await scaled_arm("luftpause", alone, workdir)
        results[ALONE] = [summary]
        print(f"{cell.name} alone: interactive {summary['interactive']['runs_per_min']}/min")
    # Per cell what measured it: a file grown cell by cell (or by `--append`) spans commits.
    made = [provenance()]
    return {"args": {k: v for k, v in vars(args).items()}, "results": results, "provenance": made}


def _earlier(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"cells": {}}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


async def main_async(a: argparse.Namespace, cells: list[Cell]) -> dict[str, Any]:
    path = RESULTS / f"{a.out}.json"
    earlier = _earlier(path)
    out: dict[str, Any] = dict(earlier.get("cells", {}))
    workdir = Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    for cell in cells:
        result = await run_cell(cell, a, workdir)
        before = out.get(cell.name)
        if a.append and before is not None:
            for arm, reps in result["results"].items():
                before["results"].setdefault(arm, []).extend(reps)
            before.setdefault("provenance", []).extend(result["provenance"])
        else:
            out[cell.name] = result
        payload = {"benchmark": "matrix", "cells": out, "logs": str(workdir)}
        payload["table"] = matrix_table(out)
        payload["ablations"] = ablation_table(out)
        write_result(a.out, payload)  # after every cell: a long run keeps what it measured
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--cells",
        nargs="+",
        default=["all"],
        help="sim, real, all, or cell names such as kv-text-unique-thrash, real-openai",
    )
    p.add_argument(
        "--arms",
        nargs="+",
        choices=ALL_ARMS,
        default=list(ARMS),
        help="default: cache_aware (the best router arm: bench.router_fields) and luftpause; "
        "ablations and round_robin: see bench.arms",
    )
    p.add_argument("--repeats", type=int, help="per cell (simulated 3, real 2)")
    p.add_argument("--time-scale", type=float, default=8.0, help="simulated cells only")
    p.add_argument("--real-window-s", type=float, default=180.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--no-alone",
        dest="alone",
        action="store_false",
        help="skip the reference run of the interactive agents without batch (one per cell)",
    )
    p.add_argument("--out", default="matrix")
    p.add_argument("--append", action="store_true", help="add repeats to cells in the file")
    a = p.parse_args()
    cells: list[Cell] = []
    for name in a.cells:
        try:
            cells += all_cells(name) if name in ("sim", "real", "all") else [Cell.parse(name)]
        except ValueError as exc:
            p.error(str(exc))
    sim = [c for c in cells if c.engine not in REAL_ENGINES]
    real = [c for c in cells if c.engine in REAL_ENGINES]
    if sim:
        asyncio.run(main_async(argparse.Namespace(**{**vars(a), "repeats": a.repeats or 3}), sim))
    if real:
        asyncio.run(main_async(argparse.Namespace(**{**vars(a), "repeats": a.repeats or 2}), real))
    table = json.loads((RESULTS / f"{a.out}.json").read_text())["table"]
    print(table)


if __name__ == "__main__":
    main()
