"""Placement decisions pinned: a fixed, seeded event stream gives the recorded actions.

The stream is closed-loop agent traffic on a pool that first has room and then is saturated
(its engines report queues, so turns are held and drained as slots free): runs finish turns with
usage (so sizes, comebacks and residency are learned) or in tool calls, fail now and then, end
and are replaced, engines stream first tokens, replicas go unhealthy and come back, ticks expire
what is due. Some replicas have a known KV pool (the KV rule holds new runs), one assigns engine
slots and saves them, one preempts. Every action `decide()` returns, and the runs and held turns
at the end, are hashed; the digest was recorded from the core before its speed work (commit
8254b72), so a change to the core that changes any placement, its order or its slot, or any
action at all, fails here. Ties are broken by ids, never by hash order, so the digest does not
depend on PYTHONHASHSEED.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque

from luftpause.common.config import Endpoint, Priorities
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.events import (
    Admit,
    Event,
    FirstToken,
    Place,
    ProbeResult,
    RunEnded,
    Tick,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from luftpause.scheduler.core.model import Rules, ServiceClass
from luftpause.scheduler.core.state import State

CALLERS = 7


def _endpoints() -> list[Endpoint]:
    out = [
        Endpoint(id=f"r{i}", url=f"http://r{i}:1", models=frozenset({"m"}), kv_tokens=kv)
        for i, kv in enumerate((0, 0, 60_000, 90_000))
    ]
    out.append(
        Endpoint(id="r4", url="http://r4:1", models=frozenset({"m", "n"}), slots=4, slot_saves=2)
    )
    out.append(
        Endpoint(
            id="r5",
            url="http://r5:1",
            models=frozenset({"m", "n"}),
            priority=Priorities(interactive=0, batch=100, preemptive=True),
            max_running=6,
        )
    )
    return out


class _Stream:
    """Closed-loop runs: every live run has one turn admitted; a finished turn's run sends its
    next one at once (or, now and then, ends and a new run takes its place)."""

    def __init__(self, runs: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.at = 1.0
        self.turn_no = 0
        self.run_no = 0
        self.in_flight: deque[str] = deque()
        self.run_of: dict[str, str] = {}
        self.prompt: dict[str, int] = {}
        self.first: list[Event] = [self._admit(self._new_run()) for _ in range(runs)]

    def _new_run(self) -> str:
        self.run_no += 1
        return f"run{self.run_no}"

    def _admit(self, run: str) -> Admit:
        self.turn_no += 1
        tid = f"t{self.turn_no}"
        self.run_of[tid] = run
        n = int(run[3:])
        self.prompt[run] = self.prompt.get(run, 2_000 + 400 * (n % 9)) + 300
        return Admit(
            at=self.at,
            turn_id=tid,
            run_id=run,
            model="n" if n % 11 == 0 else "m",
            service_class=ServiceClass.INTERACTIVE if n % 4 == 0 else ServiceClass.BATCH,
            caller=f"c{n % CALLERS}",
            prompt_bytes=4 * self.prompt[run],
            opening=((1 + n % 3, 800), (100 + n, 1_600)),
        )

    def placed(self, actions: tuple[object, ...]) -> None:
        self.in_flight.extend(a.turn_id for a in actions if isinstance(a, Place))

    def step(self, k: int, saturated: bool) -> list[Event]:
        rng = self.rng
        self.at += rng.choice((0.002, 0.01, 0.05, 0.4))
        out: list[Event] = []
        if k % 40 == 0:
            for i in range(6):
                waiting = 1 + k % 3 if saturated else 0
                healthy = not (i == 1 and k % 400 == 200)
                out.append(
                    ProbeResult(
                        at=self.at, replica_id=f"r{i}", healthy=healthy, running=5, waiting=waiting
                    )
                )
            out.append(Tick(at=self.at))
        if not self.in_flight:
            return out
        tid = self.in_flight[min(int(rng.random() * 3), len(self.in_flight) - 1)]
        self.in_flight.remove(tid)
        run = self.run_of.pop(tid)
        if rng.random() < 0.3:
            out += [TurnStarted(at=self.at, turn_id=tid), FirstToken(at=self.at, turn_id=tid)]
        roll = rng.random()
        if roll < 0.03:
            out.append(TurnFailed(at=self.at, turn_id=tid))
        else:
            out.append(
                TurnFinished(
                    at=self.at,
                    turn_id=tid,
                    tool_calls=roll < 0.6,
                    prompt_tokens=self.prompt[run],
                    completion_tokens=50 + int(rng.random() * 200),
                    cached_tokens=self.prompt[run] // 2,
                )
            )
        if rng.random() < 0.04:
            out.append(RunEnded(at=self.at, run_id=run))
            run = self._new_run()
        out.append(self._admit(run))
        return out


def _digest(rules: Rules, runs: int, steps: int, seed: int) -> tuple[str, int, int]:
    """The digest of every action and the final runs and held turns; the places and the most
    turns held at once (so the test can say the stream exercised the drain)."""
    state: State = initial_state(_endpoints(), rules=rules)
    stream = _Stream(runs, seed)
    h = hashlib.sha256()
    places = most_held = 0

    def apply(ev: Event) -> None:
        nonlocal state, places, most_held
        state, actions = decide(state, ev)
        stream.placed(actions)
        places += sum(isinstance(a, Place) for a in actions)
        most_held = max(most_held, len(state.held))
        h.update(repr(actions).encode())

    for i in range(6):
        apply(ProbeResult(at=0.5, replica_id=f"r{i}", healthy=True, running=0, waiting=0))
    for ev in stream.first:
        apply(ev)
    for k in range(steps):
        for ev in stream.step(k, saturated=k >= steps // 3):
            apply(ev)
    runs_now = sorted(
        (r.id, r.replica, str(r.phase), r.footprint, r.turns_in_flight) for r in state.runs.values()
    )
    h.update(repr(runs_now).encode())
    h.update(repr(sorted((t.id, t.bucket) for t in state.held.values())).encode())
    return h.hexdigest(), places, most_held


def test_a_seeded_saturated_stream_gives_the_recorded_decisions() -> None:
    digest, places, most_held = _digest(Rules(), runs=120, steps=3_000, seed=11)
    assert places > 2_500 and most_held > 60  # the drain placed held turns, many waited
    assert digest == "53f261e0ce7037db504ba3198c635c0e3432ab74b8a7551f8afd2da81fa580b8"


def test_a_seeded_stream_with_headroom_and_no_share_gives_the_recorded_decisions() -> None:
    rules = Rules(headroom=True, share=False)
    digest, places, most_held = _digest(rules, runs=120, steps=3_000, seed=12)
    assert places > 2_500 and most_held > 60
    assert digest == "da74ff90d9924aa6179bedd2f58cf1ebcc443ad7be75119edb2b9ecc79f9ee1a"


def _closed_loop_digest(runs: int, steps: int, seed: int) -> tuple[str, int, int]:
    """The benchmark's stream (`bench.scheduler_core`), smaller: 8 engines capped at 12 turns,
    16 callers, every run always with one turn admitted; the oldest turn in flight finishes
    (half in tool calls) and its run's next turn arrives; every 200 steps the engines are
    probed and the clock ticks. Held turns wait in every bucket with a head per caller and
    class, so each freed slot compares sixteen callers' heads. The digest of every action, and
    the places and the most turns held at once."""
    endpoints = [
        Endpoint(id=f"r{i}", url=f"http://r{i}:1", models=frozenset({"m"})) for i in range(8)
    ]
    state: State = initial_state(endpoints)
    rng = random.Random(seed)
    h = hashlib.sha256()
    in_flight: deque[str] = deque()
    run_of: dict[str, str] = {}
    places = most_held = 0
    at = 1.0

    def apply(ev: Event) -> None:
        nonlocal state, places, most_held
        state, actions = decide(state, ev)
        placed = [a.turn_id for a in actions if isinstance(a, Place)]
        in_flight.extend(placed)
        places += len(placed)
        most_held = max(most_held, len(state.held))
        h.update(repr(actions).encode())

    def probes(k: int) -> None:
        for i in range(8):
            apply(
                ProbeResult(at=at, replica_id=f"r{i}", healthy=True, running=12, waiting=1 + k % 3)
            )

    def admit(run: str, k: int) -> None:
        tid = f"t{k}-{run}"
        run_of[tid] = run
        n = int(run[3:])
        cls = ServiceClass.INTERACTIVE if n % 4 == 0 else ServiceClass.BATCH
        apply(
            Admit(at=at, turn_id=tid, run_id=run, model="m", service_class=cls, caller=f"c{n % 16}")
        )

    probes(0)
    for r in range(runs):
        admit(f"run{r}", 0)
    for k in range(1, steps + 1):
        tid = in_flight.popleft()
        at += 0.001
        apply(TurnFinished(at=at, turn_id=tid, tool_calls=rng.random() < 0.5))
        admit(run_of.pop(tid), k)
        if k % 200 == 0:
            probes(k)
            apply(Tick(at=at))
    h.update(repr(sorted((t.id, t.bucket) for t in state.held.values())).encode())
    return h.hexdigest(), places, most_held


def test_the_benchmarks_closed_loop_stream_gives_the_recorded_decisions() -> None:
    digest, places, most_held = _closed_loop_digest(runs=1_000, steps=4_000, seed=3)
    assert places > 4_000 and most_held > 800  # every freed slot drained a held turn
    assert digest == "594869022751f7ece85be61b3e3dcc7aa950818c7effe92d14e10ba137b9476c"
