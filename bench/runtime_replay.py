"""Journal replay time: how long the runtime takes to read `runs.jsonl` back and rebuild its runs.

Run: `.venv/bin/python -m bench.runtime_replay [--finished 10000] [--unfinished 1000]`.
Generates two journals through the state machine and the journal's own record functions: one
of finished runs (spawn, 3 tool rounds with a 500-character result each, the answer) and one
of unfinished runs (spawn, 2 rounds: they would resume). Times, over `--repeat` passes, reading
and decoding the file (`JournalFile.open`) and replaying the records (`journal.replay`); the
figure is the median pass, with the machine's load over the passes (`common.LoadWatch`). The two
journals are two workloads, not arms to compare, so their order is fixed. Writes
bench/results/runtime_replay.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import LoadWatch, write_result
from luftpause.runtime.core import journal
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.file import JournalFile

RESULT_TEXT = "The river rises in the hills and flows north to the sea. " * 9  # ~500 chars


def _run_records(i: int, rounds: int, finish: bool) -> list[bytes]:
    spec = m.RunSpec(handle=f"run-{i:08d}", task=f"Look up river number {i}", model="sim")
    state = m.start(spec)
    out = [journal.encode(journal.spawned_record(spec))]
    usage = m.Usage(turns=1, prompt_tokens=120, completion_tokens=24, turn_seconds=0.2)
    for r in range(rounds):
        call = m.ToolCall(id=f"call_{i}_{r}", name="lookup", arguments='{"query": "river"}')
        state, _ = m.step(state, m.TurnCompleted(content=None, tool_calls=(call,), usage=usage))
        result = m.ToolResult(call_id=call.id, name="lookup", content=RESULT_TEXT, seconds=1.0)
        state, decisions = m.step(state, m.ToolsReturned(results=(result,)))
        out += [journal.encode(x) for d in decisions if (x := journal.record_of(spec.handle, d))]
    if finish:
        state, decisions = m.step(state, m.TurnCompleted(content="It flows north.", usage=usage))
        out += [journal.encode(x) for d in decisions if (x := journal.record_of(spec.handle, d))]
    return out


def _write(path: Path, runs: int, rounds: int, finish: bool) -> int:
    with path.open("wb") as f:
        for i in range(runs):
            f.writelines(_run_records(i, rounds, finish))
    return path.stat().st_size


def _time(state_dir: Path, repeat: int) -> dict[str, Any]:
    reads, replays, runs = [], [], 0
    for _ in range(repeat):
        store = JournalFile(state_dir)
        started = time.perf_counter()
        records = store.open()
        read = time.perf_counter()
        replayed = journal.replay(records)
        done = time.perf_counter()
        store.close()
        reads.append(read - started)
        replays.append(done - read)
        runs = len(replayed.runs)
    read_s, replay_s = statistics.median(reads), statistics.median(replays)
    return {
        "runs": runs,
        "records": len(records),
        "readSeconds": round(read_s, 4),
        "replaySeconds": round(replay_s, 4),
        "totalSeconds": round(read_s + replay_s, 4),
    }


def bench(finished: int, unfinished: int, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {"repeat": repeat}
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        for name, runs, rounds, finish in (
            ("finished", finished, 3, True),
            ("unfinished", unfinished, 2, False),
        ):
            state_dir = Path(tmp) / name
            state_dir.mkdir()
            size = _write(state_dir / "runs.jsonl", runs, rounds, finish)
            with LoadWatch() as load:
                timed = _time(state_dir, repeat)
            out[name] = {"bytes": size, **timed, "load": load.summary()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--finished", type=int, default=10_000)
    p.add_argument("--unfinished", type=int, default=1_000)
    p.add_argument("--repeat", type=int, default=5)
    ns = p.parse_args()
    result = bench(ns.finished, ns.unfinished, ns.repeat)
    path = write_result("runtime_replay", result)
    for name in ("finished", "unfinished"):
        r = result[name]
        print(
            f"{r['runs']} {name} runs ({r['bytes'] / 1e6:.1f} MB): read {r['readSeconds']} s, "
            f"replay {r['replaySeconds']} s"
        )
    print(path)


if __name__ == "__main__":
    main()
