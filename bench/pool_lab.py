"""A virtual-time model of a pool behind a front, in one process: for developing placement.

Bench module, no sockets and no clock. The engines are the simulator's pure core
(`testkit.engine.core.EngineCore`, the same code `luftpause fake-engine` runs), the agents are
the load generator's closed loop (`testkit.loadgen`: tasks, tool rounds, tool time), and the
front is either luftpause or a model of a router, all on one event heap in simulated seconds:

- luftpause: the scheduler's pure decision core (`scheduler.core.decide`) fed the events the
  dataplane reports (admit, started, first token, finished), a probe of every engine each
  `probe_period_s` (what its `/metrics` and `/server_info` would say) and a tick each second;
  the dataplane's own placement on open replicas (`dataplane.local.choose_open`) for runs it
  served;
- `cache_aware`: sglang-router's policy as its documentation and defaults give it: a prefix
  tree of the requests' text per worker; when the workers' in-flight loads differ by more than
  64 and by 1.5x, the least loaded worker; else the worker with the longest match when it covers
  more than 0.3 of the text, else the one with the smallest tree. The tree is kept at 64
  characters' granularity, and the text is the messages' content;
- `round_robin`.

A front with `priority` sends the engine the request's `priority` per class, as luftpause's
endpoint `priority` does and as a router's client can. A 300-second window of 52 agents takes a
few seconds of CPU and gives the same result every time, so a rule can be tried on many engine
models at once. It is a model: it leaves out the network, the processes' own CPU and the real
router's code. Results that count come from the real processes (bench.family, bench.matrix).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from luftpause.common.config import Endpoint, Priorities
from luftpause.common.prefixes import opening_keys
from luftpause.dataplane.identity import ServiceClass as DpClass
from luftpause.dataplane.local import OpeningMemory, OpenReplica, by_model, choose_open
from luftpause.dataplane.runs import RunTable, TurnRecord
from luftpause.scheduler.core import placement
from luftpause.scheduler.core.decide import DEFAULT_RULES, decide, initial_state
from luftpause.scheduler.core.events import (
    Admit,
    FirstToken,
    Place,
    ProbeResult,
    Tick,
    TurnFinished,
    TurnStarted,
)
from luftpause.scheduler.core.model import Rules, ServiceClass
from luftpause.scheduler.core.state import State
from luftpause.testkit.agents import LOOKUP_TOOL
from luftpause.testkit.engine.core import EngineCore
from luftpause.testkit.engine.params import EngineParams
from luftpause.testkit.engine.records import Submission
from luftpause.testkit.engine.script import plan_reply
from luftpause.testkit.engine.tokens import (
    END,
    content_text,
    render_parts,
    reply_cut,
    tokenize,
    tokenize_continuation,
)
from luftpause.testkit.loadgen import LAST_CALL_NOTE, TOOL_RESULT
from luftpause.testkit.preambles import opening, pad

MODEL = "lab-model"
PRIORITY = {"interactive": 0, "batch": 100}


@dataclass(frozen=True, slots=True, kw_only=True)
class LabEngine:
    """One engine model: the batching core's parameters and what the engine tells."""

    params: EngineParams
    metrics: str = "both"  # both | sglang | vllm | llamacpp (no KV figures)
    server_info: bool = True
    reply_tokens: int = 64
    default_max_tokens: int = 256

    @property
    def reports_kv(self) -> bool:
        return self.metrics != "llamacpp"


@dataclass(frozen=True, slots=True, kw_only=True)
class LabWorkload:
    interactive: int = 4
    batch: int = 48
    context_chars: int = 10_000
    shared_chars: int = 0
    tool_calls: int = 3
    tool_s: float = 2.0
    max_tokens: int = 64
    tool_style: str = "openai"  # openai | text
    keep_tools: bool = True
    window_s: float = 300.0
    seed: int = 1
    callers: int = 4
    # Agents start within the first tool time, and each tool call takes its time times a
    # factor within 1 +- jitter: without it every agent moves in lockstep with every other.
    jitter: float = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class LabFront:
    """`luftpause` (options: affinity, priority) or a router policy."""

    kind: str = "luftpause"  # luftpause | cache_aware | round_robin
    priority: bool = False
    rules: Rules = DEFAULT_RULES
    probe_period_s: float = 2.0
    cache_threshold: float = 0.3
    balance_abs: int = 64
    balance_rel: float = 1.5
    # cache_aware: where a request without a good match goes: the smallest tree (sglang-router)
    # or the fewest requests in flight.
    unmatched: str = "tree"


class Heap:
    """The event heap: callbacks at simulated seconds, in time then insertion order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn))

    def run_until(self, end: float) -> None:
        while self._heap and self._heap[0][0] <= end:
            t, _, fn = heapq.heappop(self._heap)
            self.now = t
            fn()
        self.now = end


@dataclass(slots=True)
class _Req:
    """One turn as the engine sees it, and who waits on it."""

    turn_id: str
    sub: Submission
    on_first: Callable[[], None]
    on_done: Callable[[int, int], None]  # (generated, cached)
    generated: int = 0
    cached: int = 0


class EngineSim:
    """An engine replica: the pure core stepped back to back on the heap."""

    def __init__(self, heap: Heap, rid: str, model: LabEngine) -> None:
        self.heap = heap
        self.id = rid
        self.model = model
        self.core = EngineCore(model.params)
        self.reqs: dict[str, _Req] = {}
        self.busy = False
        self.last_end_ms = 0.0
        # What its steps did: prompt tokens computed, decode steps and the tokens they emitted,
        # and simulated milliseconds busy.
        self.prefilled = self.decode_steps = self.decoded = 0
        self.busy_ms = 0.0

    def submit(self, req: _Req) -> None:
        self.core.submit(req.sub)
        self.reqs[req.sub.rid] = req
        if not self.busy:
            self.busy = True
            self.heap.at(self.heap.now, self._step)

    def _step(self) -> None:
        step = self.core.step(max(self.heap.now * 1000.0, self.last_end_ms))
        if step is None:
            self.busy = False
            return
        self.last_end_ms = step.ends_at
        self.prefilled += step.prefill_tokens
        self.busy_ms += step.duration_ms
        if step.emitted:
            self.decode_steps += 1
            self.decoded += len(step.emitted)
        self.heap.at(step.ends_at / 1000.0, lambda: self._deliver(step))

    def _deliver(self, step: Any) -> None:
        for adm in step.admitted:
            if (r := self.reqs.get(adm.rid)) is not None:
                r.cached = adm.cached_tokens
        for rid in step.emitted:
            r = self.reqs.get(rid)
            if r is not None:
                r.generated += 1
                if r.generated == 1:
                    r.on_first()
        for rid in step.finished:
            r = self.reqs.pop(rid, None)
            if r is not None:
                r.on_done(r.generated, r.cached)
        self._step()

    def probe(self) -> dict[str, Any]:
        s = self.core.stats()
        kv = s.total_blocks * s.block_size if self.model.reports_kv else None
        return {
            "running": s.running,
            "waiting": s.waiting,
            "kv_total": kv,
            "kv_used": s.used_blocks * s.block_size if kv else None,
            "max_running": self.model.params.max_running if self.model.server_info else None,
        }


@dataclass(slots=True)
class Turn:
    turn_id: str
    run_id: str
    cls: str
    caller: str
    body: dict[str, Any]
    text: str
    sub: Submission
    reply: Any
    sent_at: float = 0.0
    replica: str = ""
    opening: tuple[Any, ...] = ()


class LuftpauseFront:
    """The scheduler's core and the dataplane's local placement, fed as the shell feeds them."""

    def __init__(self, heap: Heap, engines: list[EngineSim], front: LabFront) -> None:
        self.heap = heap
        self.engines = {e.id: e for e in engines}
        prio = Priorities(interactive=0, batch=100, preemptive=True) if front.priority else None
        endpoints = [
            Endpoint(id=e.id, url=f"http://{e.id}:1", models=frozenset({MODEL}), priority=prio)
            for e in engines
        ]
        self.state: State = initial_state(endpoints, rules=front.rules)
        self.open_version = -1
        self.open: tuple[OpenReplica, ...] = ()
        self.runs = RunTable()
        self.memory = OpeningMemory()
        self.waiting: dict[str, tuple[Turn, Callable[[str, int | None], None]]] = {}
        self.period = front.probe_period_s
        heap.at(0.0, self._probe)
        heap.at(1.0, self._tick)

    def apply(self, event: Any) -> None:
        self.state, actions = decide(self.state, event)
        for action in actions:
            if isinstance(action, Place) and action.turn_id in self.waiting:
                turn, go = self.waiting.pop(action.turn_id)
                self._go(turn, action.replica_id, action.engine_priority, go)
        if self.state.open_version != self.open_version:
            self.open_version = self.state.open_version
            opened = [
                OpenReplica(
                    replica_id=r.id,
                    url=r.url,
                    models=r.models,
                    interactive_priority=r.engine_priority(ServiceClass.INTERACTIVE),
                    batch_priority=r.engine_priority(ServiceClass.BATCH),
                )
                for r in placement.open_replicas(self.state)
            ]
            self.open = by_model(opened).get(MODEL, ())

    def seen(self) -> dict[str, Any]:
        """What the core holds and thinks of each replica now (bench.scheduler_watch's view)."""
        held = {"r": 0, "m": 0, "o": 0, "s": 0}
        for h in self.state.held.values():
            held[h.bucket[0]] += 1
        reps = {}
        for r in self.state.replicas.values():
            reps[r.id] = {
                "in_flight": r.in_flight,
                "new_batch_fits": r.new_batch_fits,
                "resident_share": r.resident_tokens / r.kv_tokens if r.kv_tokens else None,
                "capacity": r.capacity,
                "open": placement.is_open(r),
            }
        return {"held": held, "replicas": reps}

    def _probe(self) -> None:
        for e in self.engines.values():
            self.apply(ProbeResult(at=self.heap.now, replica_id=e.id, healthy=True, **e.probe()))
        self.heap.at(self.heap.now + self.period, self._probe)

    def _tick(self) -> None:
        self.apply(Tick(at=self.heap.now))
        self.heap.at(self.heap.now + 1.0, self._tick)

    def place(self, turn: Turn, go: Callable[[str, int | None], None]) -> None:
        cls = ServiceClass(turn.cls)
        known = self.runs.runs.get(turn.run_id)
        keys = opening_keys(turn.body["messages"], turn.body.get("tools")) if not known else ()
        local = choose_open(
            self.open, run=known, fresh=False, load=self.runs.load, opening=keys, memory=self.memory
        )
        turn.opening = keys
        admit = Admit(
            at=self.heap.now,
            turn_id=turn.turn_id,
            run_id=turn.run_id,
            model=MODEL,
            service_class=cls,
            caller=turn.caller,
            dataplane="dp",
            prompt_bytes=len(json.dumps(turn.body)),
            opening=keys,
            max_tokens=int(turn.body.get("max_tokens") or 0),
            placed_on="" if local is None else local.replica_id,
        )
        if local is not None:
            self.apply(admit)
            self._go(turn, local.replica_id, local.engine_priority(DpClass[turn.cls.upper()]), go)
            return
        self.waiting[turn.turn_id] = (turn, go)
        self.apply(admit)

    def _go(
        self, turn: Turn, replica: str, prio: int | None, go: Callable[[str, int | None], None]
    ) -> None:
        record = TurnRecord(
            turn_id=turn.turn_id,
            run_id=turn.run_id,
            replica_id=replica,
            model=MODEL,
            service_class=DpClass[turn.cls.upper()],
            caller=turn.caller,
        )
        self.runs.turn_placed(record, self.heap.now)
        if turn.opening:
            self.memory.record(replica, turn.opening)
        self.apply(TurnStarted(at=self.heap.now, turn_id=turn.turn_id))
        go(replica, prio)

    def first_token(self, turn: Turn) -> None:
        self.apply(FirstToken(at=self.heap.now, turn_id=turn.turn_id))

    def finished(self, turn: Turn, prompt: int, completion: int, cached: int, tools: bool) -> None:
        self.runs.turn_ended(turn.turn_id, tool_paused=tools, now=self.heap.now)
        self.apply(
            TurnFinished(
                at=self.heap.now,
                turn_id=turn.turn_id,
                tool_calls=tools,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
            )
        )


class RouterFront:
    """sglang-router's cache_aware (or round_robin) policy, as the module docstring says."""

    GRAIN = 64

    def __init__(self, engines: list[EngineSim], front: LabFront) -> None:
        self.ids = [e.id for e in engines]
        self.front = front
        self.load = dict.fromkeys(self.ids, 0)
        self.trees: dict[str, set[int]] = {i: set() for i in self.ids}
        self.rr = itertools.cycle(self.ids)

    def _chain(self, text: str) -> list[int]:
        out, h = [], 0
        for i in range(0, len(text) - self.GRAIN + 1, self.GRAIN):
            h = hash((h, text[i : i + self.GRAIN]))
            out.append(h)
        return out

    def place(self, turn: Turn, go: Callable[[str, int | None], None]) -> None:
        f = self.front
        if f.kind == "round_robin":
            chosen = next(self.rr)
        else:
            text = " ".join(content_text(m.get("content")) for m in turn.body["messages"])
            chain = self._chain(text)
            most, least = max(self.load.values()), min(self.load.values())
            if most - least > f.balance_abs and most > least * f.balance_rel:
                chosen = min(self.ids, key=lambda i: self.load[i])
            else:

                def matched(i: str) -> int:
                    n = 0
                    for h in chain:
                        if h not in self.trees[i]:
                            break
                        n += 1
                    return n

                best = max(self.ids, key=matched)
                rate = matched(best) * self.GRAIN / max(len(text), 1)
                if rate > f.cache_threshold:
                    chosen = best
                elif f.unmatched == "load":
                    chosen = min(self.ids, key=lambda i: self.load[i])
                else:
                    chosen = min(self.ids, key=lambda i: len(self.trees[i]))
            self.trees[chosen].update(chain)
        self.load[chosen] += 1
        turn.replica = chosen
        go(chosen, PRIORITY[turn.cls] if f.priority else None)

    def first_token(self, turn: Turn) -> None:
        pass

    def finished(self, turn: Turn, prompt: int, completion: int, cached: int, tools: bool) -> None:
        self.load[turn.replica] -= 1


@dataclass
class RunStats:
    cls: str
    started: float
    ended: float = -1.0
    turns: int = 0
    prompt: int = 0
    cached: int = 0
    ttft: list[float] = field(default_factory=list)


class Agents:
    """The load generator's closed loop: each agent runs tool-calling runs back to back."""

    def __init__(self, heap: Heap, wl: LabWorkload, model: LabEngine, front: Any, engines: dict):
        self.heap = heap
        self.wl = wl
        self.model = model
        self.front = front
        self.engines = engines
        self.runs: list[RunStats] = []
        self._ids = itertools.count()
        for cls, n in (("interactive", wl.interactive), ("batch", wl.batch)):
            for i in range(n):
                rng = random.Random(f"{wl.seed}:{cls}:{i}")
                start = rng.uniform(0.0, wl.tool_s)
                heap.at(start, functools.partial(self._new_run, cls, i, rng, 1))

    def _new_run(self, cls: str, index: int, rng: random.Random, n: int) -> None:
        if self.heap.now >= self.wl.window_s:
            return
        wl = self.wl
        messages = [
            *opening("none", shared_chars=wl.shared_chars, text_tools=wl.tool_style == "text"),
            {"role": "user", "content": pad(rng, wl.context_chars)},
        ]
        stats = RunStats(cls=cls, started=self.heap.now)
        self.runs.append(stats)
        run = {
            "id": f"{cls}-{index}-{n}",
            "cls": cls,
            "caller": f"caller-{index % wl.callers}",
            "messages": messages,
            "spent": 0,
            "stats": stats,
            "next": lambda: self._new_run(cls, index, rng, n + 1),
            "rng": rng,
        }
        self._turn(run)

    def _turn(self, run: dict[str, Any]) -> None:
        wl = self.wl
        offer = run["spent"] < wl.tool_calls
        body: dict[str, Any] = {"model": MODEL, "messages": run["messages"]}
        body["max_tokens"] = wl.max_tokens
        if wl.tool_style == "openai":
            if offer:
                body["tools"] = LOOKUP_TOOL
            elif wl.keep_tools:
                body.update(tools=LOOKUP_TOOL, tool_choice="none")
        style = "text" if wl.tool_style == "text" else "openai"
        reply = plan_reply(
            body,
            tool_rounds=wl.tool_calls,
            reply_tokens=self.model.reply_tokens,
            max_tokens=wl.max_tokens,
            call_id=f"call_{next(self._ids)}",
            tool_style=style,  # type: ignore[arg-type]
        )
        text, cuts = render_parts(body["messages"], body.get("tools"))
        prompt = tokenize(text)
        tid = f"t{next(self._ids)}"
        sub = Submission(
            rid=tid,
            prompt=tuple(prompt),
            reserve=wl.max_tokens,
            output_tokens=len(reply.pieces),
            history=tuple(tokenize_continuation(text, prompt, reply.body + END)),
            prompt_cuts=cuts,
            history_cuts=(*cuts, reply_cut(text, reply.body)),
        )
        turn = Turn(tid, run["id"], run["cls"], run["caller"], body, text, sub, reply)
        turn.sent_at = self.heap.now
        self.front.place(turn, lambda replica, prio: self._send(run, turn, replica, prio))

    def _send(self, run: dict[str, Any], turn: Turn, replica: str, prio: int | None) -> None:
        turn.replica = replica
        sub = turn.sub
        if prio is not None:
            sub = dataclasses.replace(sub, priority=prio)

        def first() -> None:
            run["stats"].ttft.append(self.heap.now - turn.sent_at)
            self.front.first_token(turn)

        def done(generated: int, cached: int) -> None:
            self._done(run, turn, generated, cached)

        self.engines[replica].submit(_Req(turn.turn_id, sub, first, done))

    def _done(self, run: dict[str, Any], turn: Turn, generated: int, cached: int) -> None:
        wl = self.wl
        reply = turn.reply
        calls = 0
        if wl.tool_style == "text":
            calls = 1 if "<tool_call>" in (reply.content or "") else 0
            message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        elif reply.tool_calls:
            calls = len(reply.tool_calls)
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in reply.tool_calls
                ],
            }
        else:
            message = {"role": "assistant", "content": reply.content}
        stats: RunStats = run["stats"]
        stats.turns += 1
        stats.prompt += len(turn.sub.prompt)
        stats.cached += cached
        tools = calls > 0 and wl.tool_style == "openai"
        self.front.finished(turn, len(turn.sub.prompt), generated, cached, tools)
        run["messages"] = [*run["messages"], message]
        if not calls:
            stats.ended = self.heap.now
            run["next"]()
            return
        run["spent"] += calls
        if wl.tool_style == "openai":
            result = [
                {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}
                for call in reply.tool_calls
            ]
        else:
            note = f"\n{LAST_CALL_NOTE}" if run["spent"] >= wl.tool_calls else ""
            result = [
                {"role": "user", "content": f"<tool_response>{TOOL_RESULT}</tool_response>{note}"}
            ]
        run["messages"] = [*run["messages"], *result]
        factor = 1.0 + run["rng"].uniform(-wl.jitter, wl.jitter)
        self.heap.at(self.heap.now + wl.tool_s * factor, lambda: self._turn(run))


def run_lab(
    model: LabEngine, wl: LabWorkload, front: LabFront, replicas: int = 2
) -> dict[str, Any]:
    """One arm on one engine model: the summary bench.flood reports, in simulated time."""
    heap = Heap()
    engines = [EngineSim(heap, f"e{i}", model) for i in range(replicas)]
    if front.kind == "luftpause":
        f: Any = LuftpauseFront(heap, engines, front)
    else:
        f = RouterFront(engines, front)
    agents = Agents(heap, wl, model, f, {e.id: e for e in engines})
    samples: list[list[dict[str, Any]]] = []
    seen: list[dict[str, Any]] = []

    def sample() -> None:
        samples.append([e.probe() | {"stats": e.core.stats()} for e in engines])
        if isinstance(f, LuftpauseFront):
            seen.append(f.seen())
        heap.at(heap.now + 1.0, sample)

    heap.at(0.5, sample)
    heap.run_until(wl.window_s)
    out = summarise(agents.runs, samples, wl)
    for e, row in zip(engines, out["engines"]["per_engine"], strict=True):
        row["prefilled"] = e.prefilled
        row["decode_batch_mean"] = round(e.decoded / e.decode_steps, 2) if e.decode_steps else None
        row["busy_share"] = round(e.busy_ms / 1000.0 / wl.window_s, 3)
    if seen:
        out["scheduler"] = _seen_summary(seen)
    return out


def _seen_summary(seen: list[dict[str, Any]]) -> dict[str, Any]:
    held = {k: round(statistics.fmean(s["held"][k] for s in seen), 2) for k in seen[0]["held"]}
    reps: dict[str, dict[str, Any]] = {}
    for rid in seen[0]["replicas"]:
        rows = [s["replicas"][rid] for s in seen]
        shares = [r["resident_share"] for r in rows if r["resident_share"] is not None]
        caps = [r["capacity"] for r in rows if r["capacity"] is not None]
        reps[rid] = {
            "in_flight": round(statistics.fmean(r["in_flight"] for r in rows), 2),
            "new_batch_fits": round(statistics.fmean(r["new_batch_fits"] for r in rows), 2),
            "open": round(statistics.fmean(r["open"] for r in rows), 2),
            "resident_share": round(statistics.fmean(shares), 3) if shares else None,
            "capacity": round(statistics.fmean(caps), 2) if caps else None,
        }
    return {"held": held, "replicas": reps}


def summarise(
    runs: list[RunStats], samples: list[list[dict[str, Any]]], wl: LabWorkload
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cls in ("interactive", "batch"):
        done = [r for r in runs if r.cls == cls and 0 <= r.ended <= wl.window_s]
        mine = [r for r in runs if r.cls == cls]
        times = sorted(r.ended - r.started for r in done)
        prompt = sum(r.prompt for r in mine)
        out[cls] = {
            "runs_per_min": round(len(done) / (wl.window_s / 60), 2),
            # Turns answered in the window, of finished and unfinished runs alike: runs of a
            # minute or more finish in step in a short window, so their count moves in jumps.
            "turns_per_min": round(sum(r.turns for r in mine) / (wl.window_s / 60), 2),
            "run_time_p50_s": round(times[len(times) // 2], 2) if times else None,
            "run_time_p99_s": round(times[int(len(times) * 0.99)], 2) if times else None,
            "cached_share": round(sum(r.cached for r in mine) / prompt, 4) if prompt else None,
        }
    per = []
    for i in range(len(samples[0]) if samples else 0):
        rows = [s[i] for s in samples]
        first, last = rows[0]["stats"], rows[-1]["stats"]
        prompts = last.prompt_tokens_total - first.prompt_tokens_total
        hits = last.cached_tokens_total - first.cached_tokens_total
        per.append(
            {
                "running_mean": round(statistics.fmean(r["running"] for r in rows), 2),
                "waiting_mean": round(statistics.fmean(r["waiting"] for r in rows), 2),
                "kv_used_share_mean": round(
                    statistics.fmean(r["stats"].token_usage for r in rows), 3
                ),
                "cache_hit_share": round(hits / prompts, 4) if prompts else None,
            }
        )
    out["engines"] = {"per_engine": per}
    return out
