"""The held-turn index: FIFO queues per (bucket, class, caller), and each queue's head.

Pure module: functions that change a `Draft`, no I/O. A held turn's bucket follows from its run
alone (`bucket_of`), so it only changes when the run does; `rebucket_run` moves a run's held turns
then, and `rebuild` queues every held turn again from the held turns alone. `heads[(bucket, class)]`
maps each caller with turns there to its oldest one, and is kept exact, so a drain compares heads
without touching the queues. Entries behind the head that were placed, abandoned or moved stay in
their queue until they reach its front (lazy deletion). A FIFO is two cons chains (front, reversed
back): push and pop are O(1) amortised, and an older turn moved into a queue (rare) is inserted in
arrival order in O(queue length). `new_held_since` bounds when the turns held as new runs (in
"m" buckets) arrived, so a tick knows without looking whether one has waited too long (`holds`).
"""

from __future__ import annotations

import math
from itertools import repeat

import immutables

from luftpause.scheduler.core import shares
from luftpause.scheduler.core.model import Bucket, Chain, HeldTurn, ServiceClass, evolve
from luftpause.scheduler.core.placement import bucket_fits, waits_for_home
from luftpause.scheduler.core.state import Draft, View

_NONE: immutables.Map[str, tuple[int, str]] = immutables.Map()


def bucket_of(
    view: View, run_id: str, model: str, single_pass: bool, overdue: bool = False
) -> Bucket:
    """Where a held turn of `run_id` may go: the bucket of the replica its run is pinned or
    resident on, else its model's (that of turns the KV rule held too long, if `overdue`)."""
    if single_pass:
        return ("s", "", model)
    run = view.runs.get(run_id)
    if run is not None and waits_for_home(view, run):
        replica = view.replicas.get(run.replica)
        if replica is not None and model in replica.models:
            return ("r", run.replica, model)
    return ("o" if overdue else "m", "", model)


def buckets_for_replica(view: View, replica_id: str) -> list[Bucket]:
    """Buckets whose turns may fit when `replica_id` gains room (or health)."""
    replica = view.replicas.get(replica_id)
    if replica is None:
        return []
    if replica.kind == "single-pass":
        return [("s", "", model) for model in replica.models]
    out: list[Bucket] = []
    for model in replica.models:
        out += [("r", replica_id, model), ("m", "", model), ("o", "", model)]
        serving = view.generative_by_model.get(model, ())
        if len(serving) == view.healthy_count(model):
            continue  # every replica of the model is healthy
        for rid in serving:
            if rid != replica_id and not view.replicas[rid].healthy:
                out.append(("r", rid, model))  # its pinned runs are free to move here
    return out


def best_head(view: View, buckets: list[Bucket], cls: ServiceClass) -> str | None:
    """The held turn of `cls` a drain places next from `buckets`: of the queue heads in the
    buckets that fit, the one whose caller has the fewest turns in flight, then the oldest."""
    best: _Ranked | None = None
    for bucket in buckets:
        heads = view.heads.get((bucket, cls))
        if heads and bucket_fits(view, bucket, cls):
            first = _first(heads, view.caller_in_flight)
            if best is None or first < best:
                best = first
    return None if best is None else best[1][1]


_Ranked = tuple[int, tuple[int, str]]


def _first(
    heads: immutables.Map[str, tuple[int, str]], in_flight: immutables.Map[str, int]
) -> _Ranked:
    """The head of `heads` whose caller has the fewest turns in flight, then the oldest, as
    (turns in flight, (seq, turn id)). Compared in C: each caller's count looked up by `map`,
    paired by `zip`, the least pair found by `min` (no two heads share a seq, so the turn ids
    never decide)."""
    return min(zip(map(in_flight.get, heads.keys(), repeat(0)), heads.values(), strict=True))


def add(d: Draft, turn: HeldTurn) -> None:
    """Hold `turn`: index it by run and queue it in its bucket."""
    tids = d.held_by_run.get(turn.run_id, ())
    d.held = d.held.set(turn.id, turn)
    d.held_by_run = d.held_by_run.set(turn.run_id, (*tids, turn.id))
    shares.held(d, turn, 1)
    _push(d, turn)


def remove(d: Draft, turn: HeldTurn) -> None:
    """Forget a held turn (placed or abandoned)."""
    tids = d.held_by_run.get(turn.run_id, ())
    if len(tids) == 1:
        d.held_by_run = d.held_by_run.delete(turn.run_id)
    elif tids:
        d.held_by_run = d.held_by_run.set(turn.run_id, tuple(t for t in tids if t != turn.id))
    d.held = d.held.delete(turn.id)
    shares.held(d, turn, -1)
    _unhead(d, turn)


def rebucket_run(d: Draft, run_id: str) -> list[Bucket]:
    """After `run_id` changed, move its held turns to their new buckets; return those."""
    tids = d.held_by_run.get(run_id)
    if not tids:
        return []
    moved: list[Bucket] = []
    for tid in tids:
        old = d.held[tid]
        bucket = bucket_of(d, run_id, old.model, old.single_pass, old.overdue)
        if bucket != old.bucket:
            new = evolve(old, bucket=bucket)
            d.held = d.held.set(tid, new)
            _unhead(d, old)
            _push(d, new)
            moved.append(bucket)
    return moved


def rebuild(d: Draft) -> None:
    """Every held turn queued again in its bucket, by arrival, from the held turns alone."""
    held = sorted(d.held.values(), key=lambda h: h.seq)
    d.held = immutables.Map()
    d.queues = immutables.Map()
    d.heads = immutables.Map()
    d.held_by_run = immutables.Map()
    d.new_held_since = math.inf
    for h in held:
        add(d, evolve(h, bucket=bucket_of(d, h.run_id, h.model, h.single_pass, h.overdue)))
    shares.rebuild(d)  # add() counted each held turn again on top of the old counts


# --- the queues ----------------------------------------------------------------------------


def _push(d: Draft, turn: HeldTurn) -> None:
    if turn.bucket[0] == "m" and turn.arrived_at < d.new_held_since:
        d.new_held_since = turn.arrived_at
    key = (turn.bucket, turn.service_class, turn.caller)
    hkey = (turn.bucket, turn.service_class)
    callers = d.heads.get(hkey, _NONE)
    queue: tuple[Chain, Chain]
    if turn.caller not in callers:  # no queue (an emptied one is deleted with its head)
        queue = ((turn.seq, turn.id, None), None)
    else:
        front, back = d.queues[key]
        if turn.seq > _last_seq(front, back):
            d.queues = d.queues.set(key, (front, (turn.seq, turn.id, back)))  # the head stays
            return
        queue = _insert_in_order(front, back, turn.seq, turn.id)  # an older turn moved here
    first = queue[0]
    assert first is not None
    d.queues = d.queues.set(key, queue)
    d.heads = d.heads.set(hkey, callers.set(turn.caller, (first[0], first[1])))


def _unhead(d: Draft, turn: HeldTurn) -> None:
    """If `turn` was its queue's head, move the head to the next turn still held there."""
    hkey = (turn.bucket, turn.service_class)
    callers = d.heads.get(hkey, _NONE)
    if callers.get(turn.caller, (0, ""))[1] != turn.id:
        return
    key = (turn.bucket, turn.service_class, turn.caller)
    front, back = d.queues[key]
    held = d.held
    while True:
        if front is None:
            front, back = _reverse(back), None
            if front is None:
                callers = callers.delete(turn.caller)
                d.queues = d.queues.delete(key)
                d.heads = d.heads.set(hkey, callers) if callers else d.heads.delete(hkey)
                return
        seq, tid, rest = front
        other = held.get(tid)
        if other is not None and other.bucket == turn.bucket:
            d.queues = d.queues.set(key, (front, back))
            d.heads = d.heads.set(hkey, callers.set(turn.caller, (seq, tid)))
            return
        front = rest


def _last_seq(front: Chain, back: Chain) -> int:
    if back is not None:
        return int(back[0])
    last = -1
    while front is not None:
        last, _, front = front
    return last


def _reverse(chain: Chain) -> Chain:
    out: Chain = None
    while chain is not None:
        seq, tid, chain = chain
        out = (seq, tid, out)
    return out


def _insert_in_order(front: Chain, back: Chain, seq: int, tid: str) -> tuple[Chain, Chain]:
    """The whole queue as one front chain with (seq, tid) in its place."""
    items: list[tuple[int, str]] = []
    for chain in (front, _reverse(back)):
        while chain is not None:
            s, t, chain = chain
            items.append((s, t))
    items.append((seq, tid))
    items.sort(key=lambda item: item[0])
    out: Chain = None
    for s, t in reversed(items):
        out = (s, t, out)
    return out, None
