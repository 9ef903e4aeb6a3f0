"""How often a continuation turn found its context gone, per arm, from llama.cpp's own logs.

Run after the real-pool flood: `.venv/bin/python -m bench.rereads` reads the engine logs of the
run in bench/results/flood_real.json (or `--result NAME`: its `logs` directory, its arms and
repeats); `--logs DIR` adds other runs of the same arms. Writes
bench/results/rereads.json (or `--out NAME`).

Each arm starts fresh engines, so an engine log is one segment per arm and repeat, in the order
the flood ran them (each starts with llama.cpp's "loading model" line): the arms' order per
repeat the result records (`orders`; a result without one ran every repeat in its arms' order).
For every turn the log gives its prompt length (tokens at release less the tokens generated)
and how many prompt tokens it evaluated. First turns all have about the same prompt (the shared
preamble and a task of fixed size); a turn whose prompt is longer than the shortest in its
segment by more than `CONTINUATION_MARGIN` tokens carries an earlier reply and tool result, so
it is a continuation.
A continuation that evaluated more than half its prompt found its context in neither the
engine's slots nor its prompt cache: it re-read it. Over all turns, the prompt tokens not
evaluated are the arm's share served from cache, as the engines count it (both classes).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS, write_result

CONTINUATION_MARGIN = 30
COLUMNS = [
    "re-read",
    "continuations",
    "prompt tokens",
    "of them cached",
    "first turns evaluated",
    "cached with no re-read",
]
_START = "load_model: loading model"
_PROMPT = re.compile(r"task (\d+) \| prompt eval time =\s+[\d.]+ ms /\s+(\d+) tokens")
_GEN = re.compile(r"task (\d+) \|\s+eval time =\s+[\d.]+ ms /\s+(\d+) tokens")
_DONE = re.compile(r"task (\d+) \| stop processing: n_tokens = (\d+)")


def segments(log: str) -> list[list[tuple[int, int]]]:
    """Per engine start, each finished turn's (prompt tokens, prompt tokens evaluated)."""
    out: list[list[tuple[int, int]]] = []
    evaluated: dict[str, int] = {}
    generated: dict[str, int] = {}
    for line in log.splitlines():
        if _START in line:
            out.append([])
            evaluated, generated = {}, {}
        elif m := _PROMPT.search(line):
            evaluated[m[1]] = int(m[2])
        elif m := _GEN.search(line):
            generated[m[1]] = int(m[2])
        elif (m := _DONE.search(line)) and out and m[1] in evaluated:
            prompt = int(m[2]) - generated.pop(m[1], 0)
            out[-1].append((prompt, evaluated.pop(m[1])))
    return out


def rereads(turns: list[tuple[int, int]]) -> tuple[int, int]:
    """(continuations that re-read their context, continuations) among one segment's turns."""
    if not turns:
        return 0, 0
    first = min(prompt for prompt, _ in turns)
    cont = [(p, e) for p, e in turns if p > first + CONTINUATION_MARGIN]
    return sum(1 for p, e in cont if e > p / 2), len(cont)


def cached(turns: list[tuple[int, int]]) -> tuple[int, int]:
    """(prompt tokens, of them served from the engine's cache) over one segment's turns."""
    return sum(p for p, _ in turns), sum(p - e for p, e in turns)


def reach(turns: list[tuple[int, int]]) -> tuple[int, int]:
    """(tokens first turns evaluated, tokens cached had no continuation re-read)."""
    if not turns:
        return 0, 0
    first = min(prompt for prompt, _ in turns)
    is_cont = [p > first + CONTINUATION_MARGIN for p, _ in turns]
    kept = [e for (p, e), c in zip(turns, is_cont, strict=True) if c and e <= p / 2]
    typical = int(statistics.median(kept)) if kept else 0
    new = sum(e for (_, e), c in zip(turns, is_cont, strict=True) if not c)
    evaluated = sum(
        typical if c and e > p / 2 else e for (p, e), c in zip(turns, is_cont, strict=True)
    )
    return new, sum(p for p, _ in turns) - evaluated


def per_arm(
    logs: Path, arms: list[str], orders: Sequence[Sequence[str]] | None = None
) -> dict[str, list[list[int]]]:
    """arm -> per repeat `COLUMNS`, summed over the run's engines. The repeats in `logs` are
    its engine starts per arm (a result grown by `bench.flood --append` names only the last
    invocation's directory), repeat k's in `orders[k]` (None: every repeat in `arms`' order).
    The runs `--logs` adds are taken to be the same command's: their repeats ran in `orders`.
    """
    out: dict[str, list[list[int]]] = {arm: [] for arm in arms}
    for path in sorted(logs.glob("engine-*.log")):
        segs = segments(path.read_text(errors="replace"))
        if not segs or len(segs) % len(arms):
            raise SystemExit(f"{path}: {len(segs)} engine starts, not a whole number per arm")
        if orders is not None and len(segs) > len(arms) * len(orders):
            raise SystemExit(f"{path}: {len(segs)} engine starts, over {len(orders)} repeats")
        for reps in out.values():
            reps.extend([0] * len(COLUMNS) for _ in range(len(segs) // len(arms) - len(reps)))
        for i, turns in enumerate(segs):
            order = arms if orders is None else orders[i // len(arms)]
            counts = out[order[i % len(arms)]][i // len(arms)]
            for k, n in enumerate((*rereads(turns), *cached(turns), *reach(turns))):
                counts[k] += n
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.rereads", description=__doc__)
    p.add_argument("--logs", nargs="*", type=Path, default=[], help="other runs' log dirs")
    p.add_argument("--result", default="flood_real", help="the flood result to read")
    p.add_argument("--out", default="rereads", help="result name under bench/results")
    args = p.parse_args()
    flood = json.loads((RESULTS / f"{args.result}.json").read_text())
    arms, orders = flood["args"]["arms"], flood.get("orders")
    dirs = [Path(flood["logs"]), *args.logs]
    found = [per_arm(d, arms, orders) for d in dirs]
    runs = [{"logs": str(d), "per_arm": f} for d, f in zip(dirs, found, strict=True)]
    totals = {arm: [0] * len(COLUMNS) for arm in arms}
    for by_arm in found:
        for arm, reps in by_arm.items():
            for counts in reps:
                totals[arm] = [a + b for a, b in zip(totals[arm], counts, strict=True)]
    result: dict[str, Any] = {
        "benchmark": "rereads",
        "flood": args.result,
        "continuation_margin": CONTINUATION_MARGIN,
        "runs": runs,
        "columns": COLUMNS,
        "totals": totals,
    }
    path = write_result(args.out, result)
    for arm, (reread, cont, prompt, hit, new, reachable) in totals.items():
        if not prompt:
            continue
        print(
            f"{arm}: {reread} of {cont} continuations re-read their context; "
            f"{hit / prompt:.1%} of {prompt} prompt tokens from the engines' cache "
            f"({reachable / prompt:.1%} with no re-read; new runs' tasks {new / prompt:.1%})"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
