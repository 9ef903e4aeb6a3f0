"""Placement rules: which replica, if any, may take a held turn now.

Pure module: no I/O, no clock reads. Rules, in the order they apply:

1. Routing by model: only replicas of the turn's kind that serve its model.
2. Health: an unhealthy replica gets nothing.
3. Run affinity: a run that is generating or paused on a tool goes only to the replica that
   served its last turn, while that replica is healthy and serves the model; so does an idle
   run still resident there (expected back, see `residency`), until it has waited longer than
   reading its context elsewhere would take (`holds`). Any other run may move.
4. Admission by engine load: an engine whose KV pool is known batches up to it and is capped
   only at the most requests it runs at once (`model.next_cap`); any other engine is uncapped
   until it queues, then capped at what it runs. A replica with engine `slots` never takes
   more turns than it has slots (`slots` picks which one).
5. The KV rule: a new run (or one resident nowhere) starts on a replica with a known KV pool
   only while the runs resident there and it fit a share of the pool (`residency`); held past
   NEW_RUN_MAX_HOLD_S, it goes to any replica with room.
6. Service classes: a batch turn may not take the last free slot kept for each interactive run
   paused on a tool on that replica (it will come back). On a preemptive replica (its engine
   preempts a running batch request for a waiting interactive one) no slot is kept: batch may
   fill the cap, and an interactive turn goes beyond it while the engine still runs batch work
   to preempt (fewer interactive turns in flight there than the cap).
7. Among replicas with room, an idle run prefers its last replica (its prefix may still be
   cached); a new one the replica that served its opening (its tools and first messages) of
   those near the least load (`common.prefixes.prefer`); else the least loaded.

An *open* replica (healthy, generative, uncapped, no slots to assign, room for new runs) has
room for every turn, so there rules 4 to 6 never hold a turn back and only affinity, openings and
load choose. The dataplanes are told which replicas are open and place a new run, or a run of
theirs last on an open replica, themselves; the core records such a placement as reported
(`Admit.placed_on`).
"""

from __future__ import annotations

import immutables

from luftpause.common.config import EndpointKind
from luftpause.common.prefixes import matched_bytes, prefer
from luftpause.scheduler.core.model import (
    Bucket,
    HeldTurn,
    Replica,
    Run,
    ServiceClass,
    State,
    put,
)
from luftpause.scheduler.core.openings import OpeningIndex

_CLASSES = (ServiceClass.INTERACTIVE, ServiceClass.BATCH)
_NO_INDEX = OpeningIndex()


def has_room(replica: Replica, service_class: ServiceClass) -> bool:
    """Whether `replica` can take one more turn of `service_class` now."""
    cap = replica.capacity
    if cap is None:
        return True
    free = cap - replica.in_flight
    if replica.preemptive:
        if service_class is ServiceClass.BATCH:
            return free > 0
        return replica.interactive_in_flight < cap
    if service_class is ServiceClass.BATCH:
        return free > replica.paused_interactive
    return free > 0


def is_open(replica: Replica) -> bool:
    """Every turn fits on `replica` now: a dataplane may place turns there itself."""
    return (
        replica.healthy
        and replica.capacity is None
        and replica.kind is EndpointKind.GENERATIVE
        and replica.new_batch_fits
        and replica.new_interactive_fits
    )


def open_replicas(state: State) -> tuple[Replica, ...]:
    """The open replicas, by id."""
    return tuple(sorted((r for r in state.replicas.values() if is_open(r)), key=lambda r: r.id))


def _room_flags(replica: Replica) -> tuple[bool, ...]:
    """Per room counter kind and class (see `_ROOM_KINDS`), whether `replica` counts there."""
    if not replica.healthy:
        return (False,) * 4
    room = [has_room(replica, cls) for cls in _CLASSES]
    if replica.kind is EndpointKind.SINGLE_PASS:
        return (*room, False, False)
    return (
        room[0] and replica.new_interactive_fits,
        room[1] and replica.new_batch_fits,
        *room,
    )


def _room_keys(replica: Replica) -> tuple[tuple[str, ServiceClass], ...]:
    """The (kind, class) of each flag `_room_flags` returns."""
    if replica.kind is EndpointKind.SINGLE_PASS:
        return (("s", _CLASSES[0]), ("s", _CLASSES[1]), ("", _CLASSES[0]), ("", _CLASSES[1]))
    return (("m", _CLASSES[0]), ("m", _CLASSES[1]), ("o", _CLASSES[0]), ("o", _CLASSES[1]))


def set_replica(state: State, new: Replica) -> State:
    """Store a changed replica, keeping the per-model room counters in step with it.

    Room counters, per (kind, model, class), count the healthy replicas serving the model with
    room for a turn of the class: "m" those where a new run may also start (the KV rule, see
    `residency`), "o" all of them (turns the KV rule has held long enough), "s" single-pass.
    """
    old = state.replicas[new.id]
    before, after = _room_flags(old), _room_flags(new)
    room = state.room
    if before != after:
        for (kind, cls), was, now in zip(_room_keys(new), before, after, strict=True):
            if was != now and kind:
                for model in new.models:
                    key = (kind, model, cls)
                    room = room.set(key, room.get(key, 0) + (1 if now else -1))
    version = state.open_version + (is_open(new) != is_open(old))
    return put(state, replicas=state.replicas.set(new.id, new), room=room, open_version=version)


def count_room(state: State) -> State:
    """All room counters recomputed from the replicas (initial state, resync)."""
    room: dict[tuple[str, str, ServiceClass], int] = {}
    for replica in state.replicas.values():
        for (kind, cls), fits in zip(_room_keys(replica), _room_flags(replica), strict=True):
            if fits and kind:
                for model in replica.models:
                    key = (kind, model, cls)
                    room[key] = room.get(key, 0) + 1
    return put(state, room=immutables.Map(room), open_version=state.open_version + 1)


def bucket_fits(state: State, bucket: Bucket, cls: ServiceClass) -> bool:
    """Whether a turn of `cls` in `bucket` could be placed now (all of the bucket, or none)."""
    kind, replica_id, model = bucket
    if kind == "r":
        home = state.replicas[replica_id]
        if home.healthy:
            return has_room(home, cls)
        kind = "m"
    return state.room.get((kind, model, cls), 0) > 0


def waits_for_home(state: State, run: Run) -> bool:
    """`run`'s next turn goes only to its replica: pinned there, or resident (its prefix)."""
    return state.affinity and bool(run.replica) and (run.pinned or run.resident)


def choose_replica(state: State, turn: HeldTurn) -> Replica | None:
    """The replica `turn` goes to now, or None if it must keep waiting."""
    by_model = state.single_pass_by_model if turn.single_pass else state.generative_by_model
    ids = by_model.get(turn.model, ())
    run = None if turn.single_pass else state.runs.get(turn.run_id)
    cls = turn.service_class
    # The KV rule holds new runs (and runs resident nowhere) until the held time runs out (the
    # turn sits in an "o" bucket then; one whose run became pinned meanwhile is back in "r").
    kv_rule = not turn.single_pass and turn.bucket[0] != "o"
    if run is not None and run.replica:
        home = state.replicas.get(run.replica)
        if home is not None and home.healthy and run.replica in ids:
            stays = waits_for_home(state, run)
            if has_room(home, cls) and (stays or not kv_rule or home.new_fits(cls)):
                return home  # pinned or resident, or idle and its prefix may still be cached
            if stays:
                return None
    kind = "s" if turn.single_pass else ("m" if kv_rule else "o")
    if not state.room.get((kind, turn.model, cls)):
        return None  # no healthy replica of the model has room for the turn
    replicas = state.replicas
    candidates = [
        r
        for r in (replicas[rid] for rid in ids)
        if r.healthy and has_room(r, cls) and not (kv_rule and not r.new_fits(cls))
    ]
    candidates.sort(key=_load_key)
    if not turn.opening or len(candidates) < 2:
        return candidates[0] if candidates else None
    openings = state.openings
    return prefer(
        candidates,
        load=lambda r: r.in_flight,
        matched=lambda r: matched_bytes(turn.opening, openings.get(r.id, _NO_INDEX).keys),
    )


def _load_key(replica: Replica) -> tuple[float, int, str]:
    cap = replica.capacity
    return (replica.in_flight / cap if cap else 0.0, replica.in_flight, replica.id)


def serves(state: State, model: str, single_pass: bool) -> bool:
    """Whether any replica of the kind serves `model` (healthy or not)."""
    by_model = state.single_pass_by_model if single_pass else state.generative_by_model
    return bool(by_model.get(model))
