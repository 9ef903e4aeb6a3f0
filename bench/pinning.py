"""CPU affinity for benchmark arms: a process, its threads and its children on given CPUs.

Used by `bench.overhead --pin` to give the arm under test a core of its own, as a proxy deployed
on its own machine or pod has, with the clients and the engine on the other cores.
"""

from __future__ import annotations

import os
from pathlib import Path


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` and, recursively, of its children onto `cpus`; threads and
    processes they start later inherit it.
    """
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)
        children = (task / "children").read_text().split()
        for child in children:
            pin(int(child), cpus)


def pin_arms(arms: dict[str, tuple[str, list[int]]], engine: int) -> dict[str, list[int]]:
    """The arms' processes on the last CPU, this process (the clients) and the engine on the
    rest. Returns the CPU sets used.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    proxy, rest = {cpus[-1]}, set(cpus[:-1])
    for _, pids in arms.values():
        for pid in pids:
            pin(pid, proxy)
    pin(engine, rest)
    pin(os.getpid(), rest)
    return {"arms": sorted(proxy), "clients_and_engine": sorted(rest)}
