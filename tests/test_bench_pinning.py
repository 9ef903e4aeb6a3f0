"""bench.pinning (`bench.overhead --pin`): every thread of a process, and of its children, moved."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.pinning import pin

# A parent with a thread, and a child with a thread: what a proxy with workers looks like.
_TREE = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
child = subprocess.Popen([sys.executable, "-c",
    "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); "
    "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(60)
"""


def _affinities(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(t.name)) for t in Path(f"/proc/{pid}/task").iterdir()]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_pin_moves_every_thread_of_the_process_and_its_children() -> None:
    cpu = max(os.sched_getaffinity(0))
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    try:
        time.sleep(0.1)  # the child's thread is started before it printed; the parent's too
        assert len(_affinities(proc.pid)) >= 2 and len(_affinities(child)) >= 2
        pin(proc.pid, {cpu})
        assert _affinities(proc.pid) == [{cpu}] * len(_affinities(proc.pid))
        assert _affinities(child) == [{cpu}] * len(_affinities(child))
    finally:
        os.kill(child, 9)
        proc.kill()
        proc.wait()
        proc.stdout.close()
