"""The scheduler's decision core: `decide(state, event) -> (state, actions)`.

Pure module: no I/O, no clock reads, no awaits, no randomness. The gRPC host and the prober
feed it events and carry out the actions it returns; the same sequence of events always gives
the same states and actions.

Theory of operation. `decide` makes a `Draft` of the state, ends the residency of runs not back
in time, applies the event, drains the held turns that may fit now, and freezes the draft into
the next state. A turn enters as `Admit` and waits in a queue of its bucket (see `model`) until
a replica may take it (`placement.choose_replica`). Whatever adds room (a turn ends, a probe
changes load or health, a run leaves a working set, a resync) notes the replica in
`Draft.opened` (`Draft.settle`, once the step's changes to it are in); whatever moves a held
turn to another bucket returns that bucket. Those buckets drain in priority order: interactive
before batch (while within its share, `shares`), then the caller with the fewest turns in
flight, then arrival. A placed turn puts its run in GENERATING on that replica; a reply ending
in tool calls leaves it TOOL_PAUSED there (pinned, and holding headroom against batch if it is
interactive); any other end leaves it IDLE, resident while runs like it come back
(`residency`). Ticks (`upkeep`) expire turns never reported back, runs idle too long, the turns
of dataplanes gone past their grace period, and the waits only worth a bounded time (`holds`).
"""

from __future__ import annotations

from collections.abc import Iterable

import immutables

from luftpause.common.config import Endpoint, EndpointKind
from luftpause.scheduler.core import (
    counters,
    gate,
    lifecycle,
    placement,
    queues,
    residency,
    shares,
    upkeep,
)
from luftpause.scheduler.core.events import (
    Action,
    Admit,
    DataplaneConnected,
    DataplaneDisconnected,
    Event,
    FirstToken,
    Place,
    ProbeResult,
    Reject,
    Resync,
    RunEnded,
    Tick,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from luftpause.scheduler.core.model import (
    DATAPLANE_GRACE_S,
    Bucket,
    DataplaneLink,
    HeldTurn,
    Replica,
    Rules,
    ServiceClass,
    build,
    evolve,
    limit_of,
)
from luftpause.scheduler.core.placement import (
    choose_replica,
    serves,
)
from luftpause.scheduler.core.resync import resync
from luftpause.scheduler.core.slots import save_file, saved_run
from luftpause.scheduler.core.state import Draft, State

Decision = tuple[State, tuple[Action, ...]]
DEFAULT_RULES = Rules()
Applied = tuple[list[Action], list[Bucket]]
_INTERACTIVE, _BATCH = ServiceClass.INTERACTIVE, ServiceClass.BATCH


def initial_state(
    endpoints: Iterable[Endpoint],
    *,
    dataplane_grace_s: float = DATAPLANE_GRACE_S,
    rules: Rules = DEFAULT_RULES,
) -> State:
    """The state before any event: the configured replicas, none yet known healthy."""
    replicas: dict[str, Replica] = {}
    generative: dict[str, list[str]] = {}
    single: dict[str, list[str]] = {}
    for e in endpoints:
        position = replicas[e.id].index if e.id in replicas else len(replicas)
        # No `limits` and nothing that says it is an engine of our own (its KV pool, slots,
        # running cap or priorities): unread until its first reply or probe (`Replica.unread`).
        engine = bool(e.kv_tokens or e.slots or e.max_running or e.priority)
        unread = e.kind is EndpointKind.GENERATIVE and e.limits is None and not engine
        replicas[e.id] = Replica(
            id=e.id,
            url=e.base_url,
            models=e.models,
            kind=e.kind,
            index=position,
            priority=e.priority,
            slots=e.slots,
            slot_runs=("",) * e.slots,
            saves=("",) * e.slot_saves,
            capacity=limit_of(None, e.slots, unread),
            kv_config=e.kv_tokens,
            kv_tokens=e.kv_tokens or None,
            max_running=e.max_running or None,
            unread=unread,
        )
        index = single if e.kind is EndpointKind.SINGLE_PASS else generative
        for m in sorted(e.models):
            index.setdefault(m, []).append(e.id)
    d = Draft(
        State(
            replicas=immutables.Map(replicas),
            replica_ids=tuple(replicas),
            generative_by_model=immutables.Map({m: tuple(v) for m, v in generative.items()}),
            single_pass_by_model=immutables.Map({m: tuple(v) for m, v in single.items()}),
            dataplane_grace_s=dataplane_grace_s,
            rules=rules,
        )
    )
    placement.rebuild(d)
    gate.setup(d, endpoints)
    return d.freeze()


def decide(state: State, event: Event) -> Decision:
    """Apply one event; return the new state and what the shell must do."""
    d = Draft(state)
    residency.expire(d, event.at)
    actions, buckets = _apply(d, event)
    d.settle()
    if d.held and (buckets or d.opened):
        for rid in dict.fromkeys(d.opened):
            buckets += queues.buckets_for_replica(d, rid)
        actions += _drain(d, buckets, event.at)
    if d.budget_held:
        gated, buckets = _drain_gate(d, event.at)
        actions += gated
        if buckets:
            actions += _drain(d, buckets, event.at)
    elif d.wake_at >= 0:
        d.wake_at = -1.0
    return d.freeze(), tuple(actions)


def _apply(d: Draft, event: Event) -> Applied:
    at = event.at
    match event:
        case Admit():
            return _admit(d, event)
        case TurnFinished():
            _observe(d, event, refused=False)
            return _after_turn_end(d, event.turn_id, at, event.tool_calls, event)
        case TurnFailed():
            _observe(d, event, refused=event.refused)
            return _after_turn_end(d, event.turn_id, at, tool_calls=False)
        case TurnAbandoned():
            held = d.held.get(event.turn_id)
            if held is not None:
                queues.remove(d, held)
                gate.withdraw(d, held, at)
                return [], []
            held = d.budget_held.get(event.turn_id)
            if held is not None:
                gate.withdraw(d, held, at)
                return [], []
            return _after_turn_end(d, event.turn_id, at, tool_calls=False)
        case RunEnded():
            return [], lifecycle.forget_run(d, event.run_id)
        case ProbeResult():
            upkeep.probe(d, event)
            return [], []
        case Tick():
            return upkeep.tick(d, at)
        case Resync():
            resync(d, event)
            return [], list(dict.fromkeys(t.bucket for t in d.held.values()))
        case DataplaneConnected():
            link = d.dataplanes.get(event.dataplane, DataplaneLink())
            link = DataplaneLink(streams=link.streams + 1, gone_since=None)
            d.dataplanes = d.dataplanes.set(event.dataplane, link)
            return [], []
        case DataplaneDisconnected():
            link = d.dataplanes.get(event.dataplane, DataplaneLink(streams=1))
            streams = max(link.streams - 1, 0)
            link = DataplaneLink(streams=streams, gone_since=None if streams else at)
            d.dataplanes = d.dataplanes.set(event.dataplane, link)
            return [], []
        case TurnStarted():
            _stamp(d, event.turn_id, started_at=at)
            return [], []
        case FirstToken():
            counters.first_token(d, event.turn_id)
            if event.after_s > 0:  # measured where it happened: the reading's true time
                _stamp(d, event.turn_id, started_at=at - event.after_s, first_token_at=at)
            else:
                _stamp(d, event.turn_id, first_token_at=at)
            return [], []
    raise TypeError(f"unknown event {event!r}")


# --- admission and draining ----------------------------------------------------------------


def _admit(d: Draft, ev: Admit) -> Applied:
    placed = d.turns.get(ev.turn_id)
    if placed is not None:  # a retry of an admission that already went through
        home = d.replicas[placed.replica]
        return [_place_action(d, ev.turn_id, home, placed.service_class, 0.0)], []
    if ev.turn_id in d.held or ev.turn_id in d.budget_held:
        return [], []
    lifecycle.arrived(d, ev.run_id, ev.at)
    if ev.placed_on:
        return _placed_by_dataplane(d, ev)
    if not serves(d, ev.model, ev.single_pass):
        kind = "Single-pass" if ev.single_pass else "Generative"
        reject = Reject(turn_id=ev.turn_id, message=f"no {kind} replica serves model '{ev.model}'")
        return [reject], []
    held = _held(d, ev, queues.bucket_of(d, ev.run_id, ev.model, ev.single_pass))
    d.next_seq += 1
    if gate.applies(d, held):
        return _admit_gated(d, held, ev.at)
    # Turns of its bucket and class are held: none of them fit after the last step, and all of
    # a bucket's turns of a class fit or none does (`placement.bucket_fits`), so neither does
    # this one while the step has changed no replica (`Draft.stale`: nothing read the room
    # sets yet, so every replica it stored is there).
    queued = d.heads.get((held.bucket, held.service_class))
    replica = choose_replica(d, held) if d.stale or d.opened or not queued else None
    if replica is None:
        queues.add(d, held)
        return [], []
    # It fits now, so nothing else waits in its bucket and class (no held turn ever could be
    # placed after a step): placing it at once is what a drain would do.
    moved, taken = lifecycle.start_turn(d, held, replica, ev.at, queued=False)
    return [_place_action(d, held.id, replica, held.service_class, 0.0), *taken], moved


def _placed_by_dataplane(d: Draft, ev: Admit) -> Applied:
    """Record a turn its dataplane already sent to an open replica.

    The dataplane placed it by the rule this core would apply there, on what it last heard;
    if the replica closed meanwhile the turn is still counted where it went (it may run over
    the cap until it ends, as the engine queues it). A replica unknown here, single-pass, or not
    serving the model cannot hold it in any count: nothing is recorded.
    """
    replica = d.replicas.get(ev.placed_on)
    if replica is None or replica.kind is not EndpointKind.GENERATIVE:
        return [], []
    if ev.model not in replica.models:
        return [], []
    held = _held(d, ev, ("r", replica.id, ev.model))
    d.next_seq += 1
    gate.count_placed(d, held, ev.at)
    moved, taken = lifecycle.start_turn(d, held, replica, ev.at, queued=False)
    return [_place_action(d, held.id, replica, held.service_class, 0.0), *taken], moved


def _held(d: Draft, ev: Admit, bucket: Bucket) -> HeldTurn:
    return build(
        HeldTurn,
        id=ev.turn_id,
        run_id=ev.run_id,
        model=ev.model,
        service_class=ev.service_class,
        caller=ev.caller,
        arrived_at=ev.at,
        seq=d.next_seq,
        dataplane=ev.dataplane,
        single_pass=ev.single_pass,
        bucket=bucket,
        prompt_bytes=max(ev.prompt_bytes, 0),
        opening=ev.opening,
        max_tokens=max(ev.max_tokens, 0),
        key=ev.key,
        wall_at=ev.wall_at,
    )


def _admit_gated(d: Draft, held: HeldTurn, at: float) -> Applied:
    """A turn to a rate-limited model, or of a key with a budget: see `gate`."""
    out = gate.try_admit(d, held, at)
    if out.refusal is not None:
        return [_refuse(d, held, out.refusal)], []
    if out.replica is not None:
        moved, taken = lifecycle.start_turn(d, held, out.replica, at, queued=False)
        return [_place_action(d, held.id, out.replica, held.service_class, 0.0), *taken], moved
    if out.passed:
        replica = choose_replica(d, held)
        if replica is None:
            queues.add(d, held)
            return [], []
        moved, taken = lifecycle.start_turn(d, held, replica, at, queued=False)
        return [_place_action(d, held.id, replica, held.service_class, 0.0), *taken], moved
    d.budget_held = d.budget_held.set(held.id, held)
    return [], []


def _refuse(d: Draft, held: HeldTurn, refusal: tuple[str, float]) -> Reject:
    message, retry_after = refusal
    gate.refused(d, gate.held_windows(d, held))
    return Reject(turn_id=held.id, message=message, code="rate_limited", retry_after_s=retry_after)


def _drain_gate(d: Draft, at: float) -> Applied:
    """Try the turns held for a window again, best first; a turn that does not fit blocks the
    turns behind it on the same windows. Sets `wake_at`, when the first of them fits."""
    actions: list[Action] = []
    buckets: list[Bucket] = []
    blocked: set[str] = set()
    wake: float | None = None
    for held in gate.order(d):
        ids = gate.held_windows(d, held)
        if ids and all(i in blocked for i in ids):
            continue
        out = gate.try_admit(d, held, at)
        if out.blocked:
            blocked.update(out.blocked)
            if out.wake_at is not None and (wake is None or out.wake_at < wake):
                wake = out.wake_at
            continue
        d.budget_held = d.budget_held.delete(held.id)
        if out.refusal is not None:
            actions.append(_refuse(d, held, out.refusal))
        elif out.replica is not None:
            moved, taken = lifecycle.start_turn(d, held, out.replica, at, queued=False)
            buckets += moved
            actions.append(
                _place_action(d, held.id, out.replica, held.service_class, at - held.arrived_at)
            )
            actions += taken
        else:  # its key has room; its model's replicas are not rate-limited: queue it
            queues.add(d, held)
            buckets.append(held.bucket)
    d.wake_at = -1.0 if wake is None else wake
    return actions, buckets


def _observe(d: Draft, ev: TurnFinished | TurnFailed, *, refused: bool) -> None:
    turn = d.turns.get(ev.turn_id)
    if turn is None or turn.single_pass:
        return
    if ev.reading is not None:
        sent_at = ev.reading_sent_at or ev.reading_at
        gate.observe(d, turn, ev.reading, ev.reading_at, sent_at, refused=refused)
    elif isinstance(ev, TurnFinished):  # a reply without rate-limit headers
        gate.unread_done(d, turn.replica)
        placement.mark_read(d, turn.replica)


def _place_action(
    d: Draft, turn_id: str, replica: Replica, service_class: ServiceClass, held_s: float
) -> Place:
    """The Place for turn `turn_id`, as placed on `replica` in `d`."""
    if not replica.slots:
        return Place(
            turn_id=turn_id,
            replica_id=replica.id,
            replica_url=replica.url,
            held_s=held_s,
            engine_priority=replica.engine_priority(service_class),
        )
    turn = d.turns[turn_id]
    return Place(
        turn_id=turn_id,
        replica_id=replica.id,
        replica_url=replica.url,
        held_s=held_s,
        engine_priority=replica.engine_priority(service_class),
        engine_slot=turn.slot if turn.slot >= 0 else None,
        slot_save=save_file(replica.id, turn.save_to) if turn.save_to >= 0 else None,
        slot_restore=save_file(replica.id, turn.restore_from) if turn.restore_from >= 0 else None,
        slot_save_run=saved_run(d, turn),
    )


def _drain(d: Draft, buckets: list[Bucket], at: float) -> list[Action]:
    """Place every held turn of `buckets` that fits, best first.

    Within one bucket and class every turn fits or none does (`bucket_fits`), so only the
    heads of fitting buckets are compared, and a bucket that stops fitting is done. Interactive
    turns go first, unless their class had more than its share of the pool lately and a batch
    turn fits (`shares`). Placing a turn can re-bucket other held turns of its run, and open
    room elsewhere; those buckets join the drain, and interactive turns are looked for again
    (a batch placement can move an interactive turn of its run: a run whose class changed
    between turns).

    Whether a model is past its share is asked once per drain: placing a turn moves it from
    held to in flight, which leaves the sums it reads as they were. So the interactive heads
    of models within their share are looked for first (the best of them goes whatever the
    others hold); then the best batch head; then, only if no batch head fits, the best
    interactive head of a model past its share. That is the order the share rule gives, with
    no search of heads that could not go.
    """
    actions: list[Action] = []
    pending: list[Bucket] = []
    within: list[Bucket] = []  # the pending buckets of models within their share
    beyond: list[Bucket] = []  # and of models past it
    past: dict[str, bool] = {}
    interactive = True  # an interactive head may still fit
    new = list(dict.fromkeys(buckets))
    while True:
        for b in new:
            model = b[2]
            over = past.get(model)
            if over is None:
                over = past[model] = shares.past_share(d, model, at)
            (beyond if over else within).append(b)
        pending += new
        if not d.held:
            break
        best = queues.best_head(d, within, _INTERACTIVE) if interactive and within else None
        if best is None:
            if not beyond:
                interactive = False  # no interactive head fits
            best = queues.best_head(d, pending, _BATCH)
            if best is None:
                if not interactive:
                    break
                best = queues.best_head(d, beyond, _INTERACTIVE)
                if best is None:
                    break
        turn = d.held[best]
        replica = choose_replica(d, turn)
        if replica is None:  # cannot happen while bucket_fits holds; never loop on it
            raise AssertionError(f"bucket {turn.bucket} fits but {turn.id} has no replica")
        d.settle()
        d.opened.clear()
        moved, taken = lifecycle.start_turn(d, turn, replica, at)
        d.settle()
        for rid in d.opened:
            moved += queues.buckets_for_replica(d, rid)
        new = [b for b in dict.fromkeys(moved) if b not in pending]
        interactive = interactive or bool(moved)
        actions.append(_place_action(d, turn.id, replica, turn.service_class, at - turn.arrived_at))
        actions += taken
    return actions


# --- turn ends and stamps ------------------------------------------------------------------


def _after_turn_end(
    d: Draft, turn_id: str, at: float, tool_calls: bool, usage: TurnFinished | None = None
) -> Applied:
    turn = d.turns.get(turn_id)
    if turn is None:
        return [], []
    return [], lifecycle.end_turn(d, turn, at, tool_calls, usage)


def _stamp(d: Draft, turn_id: str, **times: float) -> None:
    """Note when a placed turn's engine request started or sent its first token."""
    turn = d.turns.get(turn_id)
    if turn is not None and not turn.single_pass:
        d.turns = d.turns.set(turn_id, evolve(turn, **times))
