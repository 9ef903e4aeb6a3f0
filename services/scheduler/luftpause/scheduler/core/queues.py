"""The held-turn index: FIFO queues per (bucket, class, caller), and each queue's head.

Pure module: functions from State to State, no I/O. A held turn's bucket follows from its run
alone (`bucket_of`), so it only changes when the run does; `rebucket_run` moves a run's held
turns then. `heads[(bucket, class)]` maps each caller with turns there to its oldest one, and
is kept exact, so a drain compares heads without touching the queues. Entries behind the head
that were placed, abandoned or moved stay in their queue until they reach its front (lazy
deletion). A FIFO is two cons chains (front, reversed back): push and pop are O(1) amortised,
and an older turn moved into a queue (rare) is inserted in arrival order in O(queue length).
"""

from __future__ import annotations

from collections.abc import Iterator

import immutables

from luftpause.scheduler.core.model import (
    Bucket,
    Chain,
    HeldTurn,
    ServiceClass,
    State,
    evolve,
    put,
)
from luftpause.scheduler.core.placement import waits_for_home

_NONE: immutables.Map[str, tuple[int, str]] = immutables.Map()
QueueKey = tuple[Bucket, ServiceClass, str]


def bucket_of(
    state: State, run_id: str, model: str, single_pass: bool, overdue: bool = False
) -> Bucket:
    """Where a held turn of `run_id` may go: the bucket of the replica its run is pinned or
    resident on, else its model's (that of turns the KV rule held too long, if `overdue`)."""
    if single_pass:
        return ("s", "", model)
    run = state.runs.get(run_id)
    if run is not None and waits_for_home(state, run):
        replica = state.replicas.get(run.replica)
        if replica is not None and model in replica.models:
            return ("r", run.replica, model)
    return ("o" if overdue else "m", "", model)


def buckets_for_replica(state: State, replica_id: str) -> list[Bucket]:
    """Buckets whose turns may fit when `replica_id` gains room (or health)."""
    replica = state.replicas.get(replica_id)
    if replica is None:
        return []
    if replica.kind == "single-pass":
        return [("s", "", model) for model in replica.models]
    out: list[Bucket] = []
    for model in replica.models:
        out += [("r", replica_id, model), ("m", "", model), ("o", "", model)]
        for rid in state.generative_by_model.get(model, ()):
            if rid != replica_id and not state.replicas[rid].healthy:
                out.append(("r", rid, model))  # its pinned runs are free to move here
    return out


def heads(state: State, bucket: Bucket, cls: ServiceClass) -> Iterator[tuple[str, HeldTurn]]:
    """(caller, oldest held turn) for every caller with turns of `cls` in `bucket`."""
    for caller, (_, tid) in state.heads.get((bucket, cls), _NONE).items():
        yield caller, state.held[tid]


def add(state: State, turn: HeldTurn) -> State:
    """Hold `turn`: index it by run and queue it in its bucket."""
    tids = state.held_by_run.get(turn.run_id, ())
    state = put(
        state,
        held=state.held.set(turn.id, turn),
        held_by_run=state.held_by_run.set(turn.run_id, (*tids, turn.id)),
    )
    return _push(state, turn)


def remove(state: State, turn: HeldTurn) -> State:
    """Forget a held turn (placed or abandoned)."""
    tids = state.held_by_run.get(turn.run_id, ())
    rest = tuple(t for t in tids if t != turn.id)
    by_run = (
        state.held_by_run.set(turn.run_id, rest)
        if rest
        else state.held_by_run.delete(turn.run_id)
        if tids
        else state.held_by_run
    )
    state = put(state, held=state.held.delete(turn.id), held_by_run=by_run)
    return _unhead(state, turn)


def rebucket_run(state: State, run_id: str) -> tuple[State, list[Bucket]]:
    """After `run_id` changed, move its held turns to their new buckets; return those."""
    moved: list[Bucket] = []
    for tid in state.held_by_run.get(run_id, ()):
        old = state.held[tid]
        bucket = bucket_of(state, run_id, old.model, old.single_pass, old.overdue)
        if bucket != old.bucket:
            new = evolve(old, bucket=bucket)
            state = _unhead(put(state, held=state.held.set(tid, new)), old)
            state = _push(state, new)
            moved.append(bucket)
    return state, moved


# --- the queues ----------------------------------------------------------------------------


def _push(state: State, turn: HeldTurn) -> State:
    key = (turn.bucket, turn.service_class, turn.caller)
    hkey = (turn.bucket, turn.service_class)
    callers = state.heads.get(hkey, _NONE)
    queue: tuple[Chain, Chain]
    if turn.caller not in callers:  # no queue (an emptied one is deleted with its head)
        queue = ((turn.seq, turn.id, None), None)
    else:
        front, back = state.queues[key]
        if turn.seq > _last_seq(front, back):
            queue = (front, (turn.seq, turn.id, back))
            return put(state, queues=state.queues.set(key, queue))  # the head stays
        queue = _insert_in_order(front, back, turn.seq, turn.id)  # an older turn moved here
    first = queue[0]
    assert first is not None
    callers = callers.set(turn.caller, (first[0], first[1]))
    return put(state, queues=state.queues.set(key, queue), heads=state.heads.set(hkey, callers))


def _unhead(state: State, turn: HeldTurn) -> State:
    """If `turn` was its queue's head, move the head to the next turn still held there."""
    hkey = (turn.bucket, turn.service_class)
    callers = state.heads.get(hkey, _NONE)
    if callers.get(turn.caller, (0, ""))[1] != turn.id:
        return state
    key = (turn.bucket, turn.service_class, turn.caller)
    front, back = state.queues[key]
    while True:
        if front is None:
            front, back = _reverse(back), None
            if front is None:
                callers = callers.delete(turn.caller)
                return put(
                    state,
                    queues=state.queues.delete(key),
                    heads=state.heads.set(hkey, callers) if callers else state.heads.delete(hkey),
                )
        seq, tid, rest = front
        held = state.held.get(tid)
        if held is not None and held.bucket == turn.bucket:
            return put(
                state,
                queues=state.queues.set(key, (front, back)),
                heads=state.heads.set(hkey, callers.set(turn.caller, (seq, tid))),
            )
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
