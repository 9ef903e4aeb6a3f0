"""The scheduler's decision core: `decide(state, event) -> (state, actions)`.

Pure module: no I/O, no clock reads, no awaits, no randomness. The gRPC host and the prober
feed it events and carry out the actions it returns; the same sequence of events always gives
the same states and actions.

Theory of operation. A turn enters as `Admit` and waits in a queue of its bucket (see `model`)
until a replica may take it (`placement.choose_replica`). Whenever something adds room (a turn
ends, a probe changes load or health, a resync), the buckets that room could serve drain in
priority order: interactive before batch, then the caller with the fewest turns in flight, then
arrival. A placed turn puts its run in GENERATING on that replica; a reply ending in tool calls
leaves it TOOL_PAUSED there (pinned, and holding headroom against batch if it is interactive);
any other end leaves it IDLE (free to move). Ticks expire turns never reported back, runs idle
too long, and the turns of dataplanes gone past their grace period.
"""

from __future__ import annotations

from collections.abc import Iterable

import immutables

from luftpause.common.config import Endpoint, EndpointKind
from luftpause.scheduler.core import expiry, holds, lifecycle, queues, residency, slots
from luftpause.scheduler.core.events import (
    Action,
    Admit,
    DataplaneConnected,
    DataplaneDisconnected,
    DataplaneReleased,
    Event,
    FirstToken,
    Place,
    ProbeResult,
    Reject,
    Resync,
    RunEnded,
    RunExpired,
    Tick,
    TurnAbandoned,
    TurnExpired,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from luftpause.scheduler.core.model import (
    DATAPLANE_GRACE_S,
    RUN_IDLE_EXPIRY_S,
    Bucket,
    DataplaneLink,
    HeldTurn,
    Replica,
    ServiceClass,
    State,
    draft,
    evolve,
    kv_full,
    limit_of,
    next_cap,
    put,
)
from luftpause.scheduler.core.placement import (
    bucket_fits,
    choose_replica,
    count_room,
    serves,
    set_replica,
)
from luftpause.scheduler.core.resync import resync

Decision = tuple[State, tuple[Action, ...]]
_CLASSES = (ServiceClass.INTERACTIVE, ServiceClass.BATCH)


def initial_state(
    endpoints: Iterable[Endpoint],
    *,
    dataplane_grace_s: float = DATAPLANE_GRACE_S,
    affinity: bool = True,
) -> State:
    """The state before any event: the configured replicas, none yet known healthy."""
    replicas: dict[str, Replica] = {}
    generative: dict[str, list[str]] = {}
    single: dict[str, list[str]] = {}
    for e in endpoints:
        replicas[e.id] = Replica(
            id=e.id,
            url=e.base_url,
            models=e.models,
            kind=e.kind,
            priority=e.priority,
            slots=e.slots,
            slot_runs=("",) * e.slots,
            saves=("",) * e.slot_saves,
            capacity=limit_of(None, e.slots),
            kv_config=e.kv_tokens,
            kv_tokens=e.kv_tokens or None,
            max_running=e.max_running or None,
        )
        index = single if e.kind is EndpointKind.SINGLE_PASS else generative
        for m in sorted(e.models):
            index.setdefault(m, []).append(e.id)
    return count_room(
        State(
            replicas=immutables.Map(replicas),
            generative_by_model=immutables.Map({m: tuple(v) for m, v in generative.items()}),
            single_pass_by_model=immutables.Map({m: tuple(v) for m, v in single.items()}),
            dataplane_grace_s=dataplane_grace_s,
            affinity=affinity,
        )
    )


def decide(state: State, event: Event) -> Decision:
    """Apply one event; return the new state and what the shell must do."""
    before = state
    state, _ = residency.expire(draft(state), event.at)
    state, actions = _apply(state, event)
    # A working set that shrank (a run not back in time, a run that moved or ended) or a
    # smaller learned new run may let new runs start on replicas the event did not touch.
    opened = [
        rid for rid, replica in state.replicas.items() if _opened(before.replicas[rid], replica)
    ]
    if not opened or not state.held:
        return state, actions
    dirty = [b for rid in opened for b in queues.buckets_for_replica(state, rid)]
    state, placed = _drain(state, dirty, event.at)
    return state, (*actions, *placed)


def _opened(old: Replica, new: Replica) -> bool:
    return (new.new_batch_fits and not old.new_batch_fits) or (
        new.new_interactive_fits and not old.new_interactive_fits
    )


def _apply(state: State, event: Event) -> Decision:
    at = event.at
    match event:
        case Admit():
            return _admit(state, event)
        case TurnFinished():
            return _after_turn_end(state, event.turn_id, at, event.tool_calls, event)
        case TurnFailed():
            return _after_turn_end(state, event.turn_id, at, tool_calls=False)
        case TurnAbandoned():
            held = state.held.get(event.turn_id)
            if held is not None:
                return queues.remove(state, held), ()
            return _after_turn_end(state, event.turn_id, at, tool_calls=False)
        case RunEnded():
            state, moved = lifecycle.forget_run(state, event.run_id)
            return _drain(state, moved, at)
        case ProbeResult():
            return _probe(state, event)
        case Tick():
            return _tick(state, at)
        case Resync():
            state = resync(state, event)
            return _drain(state, _all_buckets(state), at)
        case DataplaneConnected():
            link = state.dataplanes.get(event.dataplane, DataplaneLink())
            link = DataplaneLink(streams=link.streams + 1, gone_since=None)
            return put(state, dataplanes=state.dataplanes.set(event.dataplane, link)), ()
        case DataplaneDisconnected():
            link = state.dataplanes.get(event.dataplane, DataplaneLink(streams=1))
            streams = max(link.streams - 1, 0)
            link = DataplaneLink(streams=streams, gone_since=None if streams else at)
            return put(state, dataplanes=state.dataplanes.set(event.dataplane, link)), ()
        case TurnStarted():
            return _stamp(state, event.turn_id, started_at=at), ()
        case FirstToken():
            return _stamp(state, event.turn_id, first_token_at=at), ()
    raise TypeError(f"unknown event {event!r}")


# --- admission and draining ----------------------------------------------------------------


def _admit(state: State, ev: Admit) -> Decision:
    placed = state.turns.get(ev.turn_id)
    if placed is not None:  # a retry of an admission that already went through
        home = state.replicas[placed.replica]
        return state, (_place_action(state, ev.turn_id, home, placed.service_class, 0.0),)
    if ev.turn_id in state.held:
        return state, ()
    if ev.placed_on:
        return _placed_by_dataplane(state, ev)
    if not serves(state, ev.model, ev.single_pass):
        kind = "Single-pass" if ev.single_pass else "Generative"
        return state, (
            Reject(turn_id=ev.turn_id, message=f"no {kind} replica serves model '{ev.model}'"),
        )
    held = _held(state, ev, queues.bucket_of(state, ev.run_id, ev.model, ev.single_pass))
    state = put(state, next_seq=state.next_seq + 1)
    replica = choose_replica(state, held)
    if replica is None:
        return queues.add(state, held), ()
    # It fits now, so nothing else waits in its bucket and class (no held turn ever could be
    # placed after a step): placing it at once is what a drain would do.
    state, moved, taken = lifecycle.start_turn(state, held, replica, ev.at, queued=False)
    state, more = _drain(state, moved, ev.at)
    return state, (_place_action(state, held.id, replica, held.service_class, 0.0), *taken, *more)


def _placed_by_dataplane(state: State, ev: Admit) -> Decision:
    """Record a turn its dataplane already sent to an open replica.

    The dataplane placed it by the rule this core would apply there, on what it last heard;
    if the replica closed meanwhile the turn is still counted where it went (it may run over
    the cap until it ends, as the engine queues it). A replica unknown here, single-pass, or not
    serving the model cannot hold it in any count: nothing is recorded.
    """
    replica = state.replicas.get(ev.placed_on)
    if replica is None or replica.kind is not EndpointKind.GENERATIVE:
        return state, ()
    if ev.model not in replica.models:
        return state, ()
    held = _held(state, ev, ("r", replica.id, ev.model))
    state = put(state, next_seq=state.next_seq + 1)
    state, moved, taken = lifecycle.start_turn(state, held, replica, ev.at, queued=False)
    state, more = _drain(state, moved, ev.at)
    return state, (_place_action(state, held.id, replica, held.service_class, 0.0), *taken, *more)


def _held(state: State, ev: Admit, bucket: Bucket) -> HeldTurn:
    return HeldTurn(
        id=ev.turn_id,
        run_id=ev.run_id,
        model=ev.model,
        service_class=ev.service_class,
        caller=ev.caller,
        arrived_at=ev.at,
        seq=state.next_seq,
        dataplane=ev.dataplane,
        single_pass=ev.single_pass,
        bucket=bucket,
        prompt_bytes=max(ev.prompt_bytes, 0),
        opening=ev.opening,
    )


def _place_action(
    state: State, turn_id: str, replica: Replica, service_class: ServiceClass, held_s: float
) -> Place:
    """The Place for turn `turn_id`, as placed on `replica` in `state`."""
    turn = state.turns[turn_id] if replica.slots else None
    return Place(
        turn_id=turn_id,
        replica_id=replica.id,
        replica_url=replica.url,
        held_s=held_s,
        engine_priority=replica.engine_priority(service_class),
        engine_slot=turn.slot if turn is not None and turn.slot >= 0 else None,
        slot_save=_file(replica, turn.save_to) if turn is not None else None,
        slot_restore=_file(replica, turn.restore_from) if turn is not None else None,
    )


def _file(replica: Replica, index: int) -> str | None:
    """The engine-side name of save file `index` of `replica`, None for -1."""
    return slots.save_file(replica.id, index) if index >= 0 else None


def _drain(state: State, buckets: list[Bucket], at: float) -> Decision:
    """Place every held turn of `buckets` that fits, best first.

    Within one bucket and class every turn fits or none does (`bucket_fits`), so only the
    heads of fitting buckets are compared, and a bucket that stops fitting is done. Placing a
    turn can re-bucket other held turns of its run; their new buckets join the drain, and when
    a batch placement moved an interactive turn of its run (a run whose class changed between
    turns), the interactive pass runs again for it.
    """
    if not state.held or not buckets:
        return state, ()
    actions: list[Action] = []
    pending = list(dict.fromkeys(buckets))
    classes = list(_CLASSES)
    while classes:
        cls = classes.pop(0)
        while True:
            best: tuple[int, int, HeldTurn] | None = None
            fitting = [b for b in pending if bucket_fits(state, b, cls)]
            in_flight = state.caller_in_flight
            for bucket in fitting:
                for caller, turn in queues.heads(state, bucket, cls):
                    key = (in_flight.get(caller, 0), turn.seq)
                    if best is None or key < best[:2]:
                        best = (*key, turn)
            if best is None:
                break
            turn = best[2]
            replica = choose_replica(state, turn)
            if replica is None:  # cannot happen while bucket_fits holds; never loop on it
                raise AssertionError(f"bucket {turn.bucket} fits but {turn.id} has no replica")
            state, moved, taken = lifecycle.start_turn(state, turn, replica, at)
            pending += [b for b in moved if b not in pending]
            if moved and cls is ServiceClass.BATCH and ServiceClass.INTERACTIVE not in classes:
                classes = [ServiceClass.INTERACTIVE, ServiceClass.BATCH]
            actions.append(
                _place_action(state, turn.id, replica, turn.service_class, at - turn.arrived_at)
            )
            actions += taken
    return state, tuple(actions)


# --- run phase bookkeeping (see `lifecycle`) -------------------------------------------------


def _after_turn_end(
    state: State, turn_id: str, at: float, tool_calls: bool, usage: TurnFinished | None = None
) -> Decision:
    turn = state.turns.get(turn_id)
    if turn is None:
        return state, ()
    state, moved = lifecycle.end_turn(state, turn, at, tool_calls, usage)
    return _drain(state, [*queues.buckets_for_replica(state, turn.replica), *moved], at)


def _stamp(state: State, turn_id: str, **times: float) -> State:
    """Note when a placed turn's engine request started or sent its first token."""
    turn = state.turns.get(turn_id)
    if turn is None or turn.single_pass:
        return state
    return put(state, turns=state.turns.set(turn_id, evolve(turn, **times)))


# --- probes, time --------------------------------------------------------------------------


def _probe(state: State, ev: ProbeResult) -> Decision:
    replica = state.replicas.get(ev.replica_id)
    if replica is None:
        return state, ()
    pool = replica.kv_config or ev.kv_total or replica.kv_tokens
    most = ev.max_running or replica.max_running
    kv_used = ev.kv_used
    seen = replica
    if (pool, most) != (replica.kv_tokens, replica.max_running):
        seen = evolve(replica, kv_tokens=pool, max_running=most)
    waiting = ev.waiting or 0
    # A queue with the KV full shows the engine bound by its KV (see the status page).
    kv_bound = kv_full(seen, kv_used) if waiting > 0 else replica.kv_bound
    cap = next_cap(seen, ev.running, ev.waiting)
    if (
        replica.healthy,
        replica.engine_running,
        replica.engine_waiting,
        replica.cap,
        replica.kv_tokens,
        replica.kv_used,
        replica.kv_bound,
        replica.max_running,
    ) == (ev.healthy, ev.running, ev.waiting, cap, pool, kv_used, kv_bound, most):
        return state, ()
    updated = evolve(
        seen,
        healthy=ev.healthy,
        engine_running=ev.running,
        engine_waiting=ev.waiting,
        cap=cap,
        capacity=limit_of(cap, replica.slots),
        kv_used=kv_used,
        kv_bound=kv_bound,
    )
    state = set_replica(state, updated)
    if pool != replica.kv_tokens:
        state = residency.refresh(state, replica.id)
    return _drain(state, queues.buckets_for_replica(state, replica.id), ev.at)


def _tick(state: State, at: float) -> Decision:
    actions: list[Action] = []
    dirty: list[Bucket] = []
    state, timed_out = expiry.timed_out_turns(state, at)
    for tid in timed_out:
        turn = state.turns[tid]
        state, moved = lifecycle.end_turn(state, turn, at, tool_calls=False)
        dirty += [*queues.buckets_for_replica(state, turn.replica), *moved]
        actions.append(TurnExpired(turn_id=tid, replica_id=turn.replica))
    state, due = expiry.due_run_checks(state, at)
    for rid in due:
        run = evolve(state.runs[rid], check_at=-1)
        state = put(state, runs=state.runs.set(rid, run))
        if expiry.idle_expired(run, at):
            state, moved = lifecycle.forget_run(state, rid)
            dirty += moved
            actions.append(RunExpired(run_id=rid))
            continue
        since = run.last_active if run.turns_in_flight == 0 else at
        state = expiry.schedule_run_check(state, run, since + RUN_IDLE_EXPIRY_S)
    state, freed = holds.release_waits(state, at)
    dirty += freed
    for dataplane, link in list(state.dataplanes.items()):
        if link.gone_since is not None and at - link.gone_since >= state.dataplane_grace_s:
            state, released, moved = _release_dataplane(state, dataplane, at)
            dirty += moved
            actions.append(DataplaneReleased(dataplane=dataplane, turns=released))
    state, placed = _drain(state, dirty, at) if dirty else (state, ())
    return state, (*actions, *placed)


def _release_dataplane(state: State, dataplane: str, at: float) -> tuple[State, int, list[Bucket]]:
    """Free every turn a gone dataplane had in flight; it no longer reports them."""
    gone = [t for t in state.turns.values() if t.dataplane == dataplane]
    dirty: list[Bucket] = []
    for turn in gone:
        state, moved = lifecycle.end_turn(state, turn, at, tool_calls=False)
        dirty += [*queues.buckets_for_replica(state, turn.replica), *moved]
    return put(state, dataplanes=state.dataplanes.delete(dataplane)), len(gone), dirty


def _all_buckets(state: State) -> list[Bucket]:
    return list(dict.fromkeys(t.bucket for t in state.held.values()))
