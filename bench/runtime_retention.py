"""Start-up with a long history, before and after retention: how long the runtime takes to start
when 1,000 runs are live and 1,000,000 finished ones are in its journal file (before: every run
ever spawned is replayed at every start), and when retention has moved the finished ones to the
archive (after: only the live runs are).

Run: `.venv/bin/python -m bench.runtime_retention [--finished 1000000] [--live 1000]`.

The journal: one finished run and one live run are made through the state machine and the
journal's own record functions, as the runtime journals them (format 2: `spawned`; per tool
round a line of `turn` and `call`, then `round` with the result; `finished`), and written out
once per run with the run's handle and call ids put in (bytes replaced: writing a million runs
through the state machine would take minutes of this 2-core machine for the same lines). Each
finished run did one tool round (a 100-character result) and answered 30 days ago; each live
run did two rounds and would resume; the live runs are spread through the file. One retention
pass (`retention.expired`, `JournalFile.archive`, a week's age) makes the "after" journal from
a copy, and is timed.

Two measures per arm, each in a fresh process, arms alternated with their order rotated per
repeat, the machine's load recorded per arm and repeat (`common.LoadWatch`, under "load"):
- `startSeconds`: `luftpause runtime` from exec until `/health` answers (reading and replaying
  the journal, the runs made, the start's retention pass, the server up), on a copy of the
  state dir, with its peak memory; "before" with `--retain-finished 0` (every run kept, as the
  runtime was), "after" with the default week. Its dataplane is a closed port: the live runs
  resume and wait for it; the process is stopped by its PID once it answers.
- `replaySeconds`: `JournalFile.open` and `journal.replay` alone (the part history weighs on).

Writes bench/results/runtime_retention.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import LoadWatch, rotated, write_result
from luftpause.runtime.core import forks, journal, retention
from luftpause.runtime.core import machine as m
from luftpause.runtime.journal.file import JOURNAL_NAME, JournalFile
from luftpause.testkit.procs import free_port

DAY = 86400.0
AGE = 7 * DAY
RESULT_TEXT = "The river rises in the hills and flows north to the sea, past the old mill. "
HANDLE = "run-TEMPLATEXX"  # replaced by each run's handle (same length or not: JSON text)
NUMBER = "NUMBERXX"  # replaced by each run's number (task text and call ids)
START_LIMIT = 3600.0  # seconds a start may take before the benchmark gives up on it
MEMORY_FLOOR_MB = 2048  # a measured process is stopped when the machine has less left


def template(rounds: int, ended: float | None) -> bytes:
    """One run's journal lines as the runtime writes them, with placeholders for its handle and
    number: `rounds` tool rounds, then (with `ended`) the answer at that time."""
    spec = m.RunSpec(handle=HANDLE, task=f"Look up river number {NUMBER}", model="sim",
                     spawned_at=(ended or time.time()) - 60)  # fmt: skip
    state = m.start(spec)
    lines = [journal.encode(journal.spawned_record(spec))]
    usage = m.Usage(turns=1, prompt_tokens=120, completion_tokens=24, turn_seconds=0.2)

    def step(event: m.Event) -> None:
        nonlocal state
        state, decisions = m.step(state, event)
        records = [r for d in decisions if (r := journal.record_of(HANDLE, d)) is not None]
        if records:  # one line per step, as `Runtime._apply` writes it
            line = records[0] if len(records) == 1 else forks.batch_record(records)
            lines.append(journal.encode(line))

    for r in range(rounds):
        call = m.ToolCall(id=f"call_{NUMBER}_{r}", name="lookup", arguments='{"query": "river"}')
        step(m.TurnCompleted(content=None, tool_calls=(call,), usage=usage))
        step(m.CallSending(call_id=call.id, resendable=True, approval=False))
        result = m.ToolResult(call_id=call.id, name="lookup", content=RESULT_TEXT, seconds=1.0)
        step(m.CallReturned(result=result))
    if ended is not None:
        step(m.TurnCompleted(content="It flows north.", usage=usage, at=ended))
        assert state.phase is m.Phase.FINISHED
    return b"".join(lines)


def _run(lines: bytes, i: int) -> bytes:
    return lines.replace(HANDLE.encode(), f"run-{i:010d}".encode()).replace(
        NUMBER.encode(), str(i).encode()
    )


def generate(path: Path, finished: int, live: int, now: float) -> int:
    """Write the journal: `finished` old finished runs with `live` live ones spread among them."""
    done, going = template(1, now - 30 * DAY), template(2, None)
    every = max(1, finished // max(1, live))
    n_live = 0
    with path.open("wb", buffering=1 << 20) as f:
        for i in range(finished):
            f.write(_run(done, i))
            if i % every == 0 and n_live < live:
                f.write(_run(going, finished + n_live))
                n_live += 1
        for j in range(n_live, live):
            f.write(_run(going, finished + j))
    return path.stat().st_size


# --- measures (each in a fresh process) -------------------------------------------------------


def replay_once(state_dir: Path) -> dict[str, Any]:
    """Read and replay the journal in this process."""
    started = time.perf_counter()
    store = JournalFile(state_dir)
    records = store.open()
    replayed = journal.replay(records)
    took = time.perf_counter() - started
    store.close()
    live = sum(1 for s in replayed.runs.values() if not s.phase.over)
    return {"seconds": took, "runs": len(replayed.runs), "live": live, "peakRssMb": _peak_mb()}


def _peak_mb(pid: int | str = "self") -> float:
    """A process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited through the
    fork that started it)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def _guard(proc: subprocess.Popen[Any], started: float) -> None:
    """Stop a measured process that ran out of time, or would take the machine's last memory
    (a million finished runs replayed take well over ten gigabytes; the machine is shared)."""
    if time.perf_counter() - started > START_LIMIT:
        raise TimeoutError(f"the measured process did not finish in {START_LIMIT:g} s")
    if _mem_available_mb() < MEMORY_FLOOR_MB:
        raise MemoryError(f"less than {MEMORY_FLOOR_MB} MB of memory left to the machine")


def replay_measured(state_dir: Path) -> dict[str, Any]:
    """`replay_once` in a fresh process."""
    return _in_child("--replay-only", str(state_dir))


def retain_measured(state_dir: Path, now: float) -> dict[str, Any]:
    """`retain` in a fresh process (its memory goes back to the machine when it ends)."""
    return _in_child("--retain-only", str(state_dir), "--now", repr(now))


def _in_child(*args: str) -> dict[str, Any]:
    """This module's `args` in a fresh process, guarded; the JSON it prints."""
    argv = [sys.executable, "-m", "bench.runtime_retention", *args]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    try:
        while proc.poll() is None:
            _guard(proc, started)
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    assert proc.stdout is not None
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{args[0]} exited with {proc.returncode}")
    result: dict[str, Any] = json.loads(out.splitlines()[-1])  # after the child's own logs
    return result


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def start_measured(source: Path, work: Path, retain: float) -> dict[str, Any]:
    """`luftpause runtime` on a copy of `source` from exec until /health answers."""
    state = work / "state"
    shutil.rmtree(state, ignore_errors=True)
    shutil.copytree(source, state)
    port = free_port()
    argv = [str(Path(sys.executable).with_name("luftpause")), "runtime", "--port", str(port),
            "--state-dir", str(state), "--dataplane", f"http://127.0.0.1:{_closed_port()}",
            "--retain-finished", f"{retain:g}", "--stop-grace", "0"]  # fmt: skip
    log = (work / "runtime.log").open("wb")
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the runtime exited with {proc.returncode}: see {log.name}")
            _guard(proc, started)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        took = time.perf_counter() - started
        peak = _peak_mb(proc.pid)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        log.close()
    shutil.rmtree(state, ignore_errors=True)
    return {"seconds": took, "peakRssMb": peak}


def retain(state_dir: Path, now: float) -> dict[str, Any]:
    """One retention pass over the journal, as a runtime with retention on makes at its start."""
    started = time.perf_counter()
    store = JournalFile(state_dir)
    replayed = journal.replay(store.open())
    gone = retention.expired({h: _Held(s) for h, s in replayed.runs.items()}, now, AGE)
    moved = asyncio.run(store.archive(gone))
    store.close()
    took = time.perf_counter() - started
    return {"seconds": round(took, 2), "runs": len(gone), "records": moved, "peakRssMb": _peak_mb()}


class _Held:
    def __init__(self, state: m.RunState) -> None:
        self.state = state


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [s["seconds"] for s in samples]
    return {
        "medianSeconds": round(statistics.median(seconds), 3),
        "minSeconds": round(min(seconds), 3),
        "maxSeconds": round(max(seconds), 3),
        "peakRssMb": round(statistics.median(s["peakRssMb"] for s in samples), 1),
    }


def _arms(before: Path, after: Path) -> Iterator[tuple[str, Path, float]]:
    yield "before", before, retention.KEEP_FOREVER
    yield "after", after, AGE


def bench(finished: int, live: int, repeat: int) -> dict[str, Any]:
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-retention-", dir="/var/tmp") as tmp:
        before, after, work = Path(tmp) / "before", Path(tmp) / "after", Path(tmp) / "work"
        for d in (before, work):
            d.mkdir()
        started = time.perf_counter()
        size = generate(before / JOURNAL_NAME, finished, live, now)
        made = time.perf_counter() - started
        print(f"generated {size / 1e6:.0f} MB in {made:.0f} s", flush=True)
        shutil.copytree(before, after)
        pass_ = retain_measured(after, now)
        print(f"retention pass: {pass_}", flush=True)
        arms = {name: (path, age) for name, path, age in _arms(before, after)}
        starts: dict[str, list[dict[str, Any]]] = {k: [] for k in arms}
        replays: dict[str, list[dict[str, Any]]] = {k: [] for k in arms}
        loads: dict[str, list[dict[str, Any]]] = {k: [] for k in arms}
        for i in range(repeat):
            for name in rotated(list(arms), i):
                path, age = arms[name]
                with LoadWatch() as load:
                    starts[name].append(start_measured(path, work, age))
                    replays[name].append(replay_measured(path))
                loads[name].append(load.summary())
                print(f"{name}: start {starts[name][-1]}, replay {replays[name][-1]}", flush=True)
        live_bytes = (after / JOURNAL_NAME).stat().st_size
    out: dict[str, Any] = {
        "finished": finished,
        "live": live,
        "repeat": repeat,
        "generatedSeconds": round(made, 1),
        "journalBytes": {"before": size, "after": live_bytes},
        "retentionPass": pass_,
    }
    for name in arms:
        out[name] = {
            "runsReplayed": replays[name][0]["runs"],
            "liveRuns": replays[name][0]["live"],
            "start": _summary(starts[name]),
            "replay": _summary(replays[name]),
            "load": loads[name],
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--finished", type=int, default=1_000_000)
    p.add_argument("--live", type=int, default=1_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default="runtime_retention", help="result file name (no .json)")
    p.add_argument("--replay-only", metavar="STATE_DIR", help=argparse.SUPPRESS)
    p.add_argument("--retain-only", metavar="STATE_DIR", help=argparse.SUPPRESS)
    p.add_argument("--now", type=float, help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.replay_only:
        print(json.dumps(replay_once(Path(ns.replay_only))))
        return
    if ns.retain_only:
        print(json.dumps(retain(Path(ns.retain_only), ns.now)))
        return
    result = bench(ns.finished, ns.live, ns.repeat)
    path = write_result(ns.out, result)
    b, a = result["before"], result["after"]
    print(
        f"start-up with {result['live']} live and {result['finished']} finished runs: "
        f"before {b['start']['medianSeconds']} s ({b['start']['peakRssMb']} MB), "
        f"after {a['start']['medianSeconds']} s ({a['start']['peakRssMb']} MB)"
    )
    print(path)


if __name__ == "__main__":
    main()
