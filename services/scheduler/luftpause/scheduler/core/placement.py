"""Placement rules: which replica, if any, may take a held turn now.

Pure module: no I/O, no clock reads. Rules, in the order they apply (`model.Rules` names the
ones that can be switched off):

1. Routing by model: only replicas of the turn's kind that serve its model.
2. Health: an unhealthy replica gets nothing.
3. Run affinity (`affinity`): a run that is generating or paused on a tool goes only to the
   replica that served its last turn, while that replica is healthy and serves the model; so
   does an idle run still resident there (`soft_affinity`: expected back, see `residency`),
   until it has waited longer than reading its context elsewhere would take (`holds`). Any
   other run may move.
4. Admission by engine load: an engine whose KV pool is known batches up to it and is capped
   only at the most requests it runs at once (`model.next_cap`); any other engine is uncapped
   until it queues, then capped at what it runs. A replica with engine `slots` never takes
   more turns than it has slots (`slots` picks which one).
5. The KV rule (`kv_rule`): a new run (or one resident nowhere) is held while no replica has
   room in its KV pool for the runs resident there and one more (`residency`) or nothing
   waiting to be read (`Replica.new_fits`: an engine with nothing queued to read starts a new
   run at once, and holding it would only leave that engine idle); held past
   NEW_RUN_MAX_HOLD_S, it goes to any replica with room.
6. Service classes (`headroom`, off by default): a batch turn may not take the last free slot
   kept for each interactive run paused on a tool on that replica (it will come back). On a
   preemptive replica (its engine preempts a running batch request for a waiting interactive
   one) no slot is kept: batch may fill the cap, and an interactive turn goes beyond it while
   the engine still runs batch work to preempt (fewer interactive turns in flight there than
   the cap).
7. Among replicas with room, an idle run prefers its last replica (its prefix may still be
   cached); a new one, or one that moves, goes where it costs the engines least to read
   (`cost`: the reading queued there, its own less what is cached there, and the resident
   contexts it would push out of the pool).

An *open* replica (healthy, generative, uncapped, no slots to assign, room for new runs, not
rate-limited: those are admitted by their budget, `gate`) has
room for every turn, so there rules 4 to 6 never hold a turn back and only affinity and cost
choose. The dataplanes are told which replicas are open and place a run of theirs last on an
open replica, or one they started, themselves; the core records such a placement as reported
(`Admit.placed_on`).
"""

from __future__ import annotations

from luftpause.scheduler.core import room
from luftpause.scheduler.core.cost import cost
from luftpause.scheduler.core.model import (
    Bucket,
    HeldTurn,
    Replica,
    Run,
    ServiceClass,
    evolve,
    limit_of,
)
from luftpause.scheduler.core.room import is_open, room_pair
from luftpause.scheduler.core.state import Draft, View


def has_room(replica: Replica, service_class: ServiceClass) -> bool:
    """Whether `replica` can take one more turn of `service_class` now."""
    interactive, batch = room_pair(replica)
    return batch if service_class is ServiceClass.BATCH else interactive


def open_replicas(view: View) -> tuple[Replica, ...]:
    """The open replicas, by id."""
    return tuple(sorted((r for r in view.replicas.values() if is_open(r)), key=lambda r: r.id))


def set_replica(d: Draft, new: Replica) -> None:
    """Store a changed replica. The room sets and the open version (`room`) follow at the
    step's next `Draft.settle`, from the replica as the room sets last saw it to how it is
    then; a replica that gained room is noted in `d.opened` then: `decide` drains its held
    turns."""
    rid = new.id
    if rid not in d.stale:
        d.stale[rid] = d.replicas[rid]
    d.replicas = d.replicas.set(rid, new)


def update_replica(d: Draft, replica: Replica, **changes: object) -> Replica:
    """Store `replica` with `changes` and return it as stored. A replica this step already
    stored since the room sets last looked (`Draft.stale` keeps the one they saw) is the
    step's own copy and changes in place; any other is copied once (`set_replica`). So a freed
    slot, or a placed turn, copies its replica once for its counters, residency and slots. The
    caller must not read `replica` afterwards expecting the old values."""
    rid = replica.id
    seen = d.stale.get(rid)
    if seen is not None and seen is not replica and d.replicas.get(rid) is replica:
        replica.__dict__.update(changes)
        return replica
    new = evolve(replica, **changes)
    set_replica(d, new)
    return new


def mark_read(d: Draft, replica_id: str) -> None:
    """`replica_id` is no longer unread (`Replica.unread`): its cap and slots bound it again,
    and its held turns may go."""
    replica = d.replicas.get(replica_id)
    if replica is None or not replica.unread:
        return
    capacity = limit_of(replica.cap, replica.slots)
    set_replica(d, evolve(replica, unread=False, capacity=capacity))
    d.opened.append(replica_id)


def rebuild(d: Draft) -> None:
    """The room sets recomputed from the replicas (initial state, Resync); the open version
    moves, so the shell publishes the open replicas again."""
    d.room = room.build(d.replicas.values())
    d.stale.clear()
    d.open_version += 1


def bucket_fits(view: View, bucket: Bucket, cls: ServiceClass) -> bool:
    """Whether a turn of `cls` in `bucket` could be placed now (all of the bucket, or none)."""
    kind, replica_id, model = bucket
    if kind == "r":
        home = view.replicas[replica_id]
        if home.healthy:
            return has_room(home, cls)
        kind = "m"
    return bool(view.room_for((kind, model, cls)))


def waits_for_home(view: View, run: Run) -> bool:
    """`run`'s next turn goes only to its replica: pinned there (`affinity`), or resident
    (its prefix; `soft_affinity`)."""
    if not run.replica:
        return False
    rules = view.rules
    return (rules.affinity and run.pinned) or (rules.soft_affinity and run.resident)


def choose_replica(view: View, turn: HeldTurn) -> Replica | None:
    """The replica `turn` goes to now, or None if it must keep waiting."""
    cls = turn.service_class
    replicas = view.replicas
    if turn.single_pass:
        ids = view.room_for(("s", turn.model, cls))
        if not ids:
            return None
        return min((replicas[rid] for rid in view.room_ids(ids)), key=_load_key)
    # The KV rule holds new runs (and runs resident nowhere) until the held time runs out (the
    # turn sits in an "o" bucket then; one whose run became pinned meanwhile is back in "r").
    kv_rule = turn.bucket[0] != "o"
    run = view.runs.get(turn.run_id)
    if run is not None and run.replica:
        home = replicas.get(run.replica)
        if home is not None and home.healthy and turn.model in home.models:
            stays = waits_for_home(view, run)
            if has_room(home, cls) and (stays or not kv_rule or home.new_fits(cls)):
                return home  # pinned or resident, or idle and its prefix may be cached
            if stays:
                return None
    if kv_rule and not view.room_for(("m", turn.model, cls)):
        return None  # no working set leaves room for a new run anywhere: held (`residency`)
    ids = view.room_for(("o", turn.model, cls))
    if not ids:
        return None
    if not ids & (ids - 1):  # one replica has room
        return replicas[view.replica_ids[ids.bit_length() - 1]]
    return min(
        (replicas[rid] for rid in view.room_ids(ids)), key=lambda r: cost(view, turn, run, r)
    )


def _load_key(replica: Replica) -> tuple[float, int, str]:
    cap = replica.capacity
    return (replica.in_flight / cap if cap else 0.0, replica.in_flight, replica.id)


def serves(view: View, model: str, single_pass: bool) -> bool:
    """Whether any replica of the kind serves `model` (healthy or not)."""
    by_model = view.single_pass_by_model if single_pass else view.generative_by_model
    return bool(by_model.get(model))
