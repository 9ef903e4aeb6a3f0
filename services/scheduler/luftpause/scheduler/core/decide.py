"""The scheduler's decision core: `decide(state, event) -> (state, actions)`.

Pure module: no I/O, no clock reads, no awaits, no randomness. The gRPC host and the prober
feed it events and carry out the actions it returns; the same sequence of events always gives
the same states and actions.

Theory of operation. A turn enters as `Admit` and waits in `held` until a replica may take it
(`placement.choose_replica`). Whenever something frees or adds room (a turn ends, a probe
changes load or health, a resync), held turns drain in priority order: interactive before
batch, then the caller with the fewest turns in flight, then arrival. A placed turn puts its
run in GENERATING on that replica; a reply ending in tool calls leaves it TOOL_PAUSED there
(pinned, and holding headroom against batch if it is interactive); any other end leaves it
IDLE (free to move). Ticks expire turns never reported back and runs idle too long.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import replace

import immutables

from luftpause.common.config import Endpoint, EndpointKind
from luftpause.scheduler.core.model import (
    RUN_IDLE_EXPIRY_S,
    TURN_TIMEOUT_S,
    Action,
    Admit,
    Event,
    FirstToken,
    HeldTurn,
    Phase,
    Place,
    ProbeResult,
    Reject,
    Replica,
    Resync,
    Run,
    RunEnded,
    RunExpired,
    ServiceClass,
    State,
    Tick,
    Turn,
    TurnAbandoned,
    TurnExpired,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from luftpause.scheduler.core.placement import choose_replica, serves

Decision = tuple[State, tuple[Action, ...]]


def initial_state(endpoints: Iterable[Endpoint]) -> State:
    """The state before any event: the configured replicas, none yet known healthy."""
    replicas: dict[str, Replica] = {}
    generative: dict[str, list[str]] = {}
    single: dict[str, list[str]] = {}
    for e in endpoints:
        replicas[e.id] = Replica(id=e.id, url=e.base_url, models=e.models, kind=e.kind)
        index = single if e.kind is EndpointKind.SINGLE_PASS else generative
        for m in sorted(e.models):
            index.setdefault(m, []).append(e.id)
    return State(
        replicas=immutables.Map(replicas),
        generative_by_model=immutables.Map({m: tuple(v) for m, v in generative.items()}),
        single_pass_by_model=immutables.Map({m: tuple(v) for m, v in single.items()}),
    )


def decide(state: State, event: Event) -> Decision:
    """Apply one event; return the new state and what the shell must do."""
    state = replace(state, now=max(state.now, event.at))
    match event:
        case Admit():
            return _admit(state, event)
        case TurnFinished():
            return _drain(_end_turn(state, event.turn_id, event.at, event.tool_calls))
        case TurnFailed():
            return _drain(_end_turn(state, event.turn_id, event.at, tool_calls=False))
        case TurnAbandoned():
            if event.turn_id in state.held:
                return replace(state, held=state.held.delete(event.turn_id)), ()
            return _drain(_end_turn(state, event.turn_id, event.at, tool_calls=False))
        case RunEnded():
            return _drain(_forget_run(state, event.run_id))
        case ProbeResult():
            return _drain(_probe(state, event))
        case Tick():
            return _tick(state, event.at)
        case Resync():
            return _drain(_resync(state, event))
        case TurnStarted() | FirstToken():
            return state, ()
    raise TypeError(f"unknown event {event!r}")


# --- admission and draining ----------------------------------------------------------------


def _admit(state: State, ev: Admit) -> Decision:
    placed = state.turns.get(ev.turn_id)
    if placed is not None:  # a retry of an admission that already went through
        url = state.replicas[placed.replica].url
        return state, (
            Place(turn_id=ev.turn_id, replica_id=placed.replica, replica_url=url, held_s=0.0),
        )
    if ev.turn_id in state.held:
        return state, ()
    if not serves(state, ev.model, ev.single_pass):
        kind = "Single-pass" if ev.single_pass else "Generative"
        return state, (
            Reject(turn_id=ev.turn_id, message=f"no {kind} replica serves model '{ev.model}'"),
        )
    held = HeldTurn(
        id=ev.turn_id,
        run_id=ev.run_id,
        model=ev.model,
        service_class=ev.service_class,
        caller=ev.caller,
        arrived_at=ev.at,
        seq=state.next_seq,
        dataplane=ev.dataplane,
        single_pass=ev.single_pass,
    )
    state = replace(state, held=state.held.set(held.id, held), next_seq=state.next_seq + 1)
    return _drain(state)


def _priority(state: State, turn: HeldTurn) -> tuple[bool, int, int]:
    return (
        turn.service_class is not ServiceClass.INTERACTIVE,
        state.caller_in_flight.get(turn.caller, 0),
        turn.seq,
    )


def _drain(state: State) -> Decision:
    """Place every held turn that fits, best first; keys only grow while we place."""
    if not state.held:
        return state, ()
    heap = [(_priority(state, t), t.id) for t in state.held.values()]
    heapq.heapify(heap)
    actions: list[Action] = []
    while heap:
        key, turn_id = heapq.heappop(heap)
        turn = state.held[turn_id]
        fresh = _priority(state, turn)
        if fresh != key:
            heapq.heappush(heap, (fresh, turn_id))
            continue
        replica = choose_replica(state, turn)
        if replica is None:
            continue
        state = _place(state, turn, replica)
        actions.append(
            Place(
                turn_id=turn.id,
                replica_id=replica.id,
                replica_url=replica.url,
                held_s=state.now - turn.arrived_at,
            )
        )
    return state, tuple(actions)


def _place(state: State, held: HeldTurn, replica: Replica) -> State:
    turn = Turn(
        id=held.id,
        run_id=held.run_id,
        replica=replica.id,
        model=held.model,
        service_class=held.service_class,
        caller=held.caller,
        placed_at=state.now,
        dataplane=held.dataplane,
        single_pass=held.single_pass,
    )
    replicas = state.replicas.set(replica.id, replace(replica, in_flight=replica.in_flight + 1))
    state = replace(
        state,
        held=state.held.delete(held.id),
        turns=state.turns.set(turn.id, turn),
        replicas=replicas,
    )
    if held.single_pass:
        return state
    state = _unpause(state, held.run_id)
    old = state.runs.get(held.run_id)
    run = Run(
        id=held.run_id,
        replica=replica.id,
        phase=Phase.GENERATING,
        service_class=held.service_class,
        caller=held.caller,
        turns_in_flight=(old.turns_in_flight if old else 0) + 1,
        last_active=state.now,
    )
    callers = state.caller_in_flight
    return replace(
        state,
        runs=state.runs.set(run.id, run),
        caller_in_flight=callers.set(held.caller, callers.get(held.caller, 0) + 1),
    )


# --- run phase bookkeeping -----------------------------------------------------------------


def _bump_paused(state: State, replica_id: str, delta: int) -> State:
    replica = state.replicas.get(replica_id)
    if replica is None:
        return state
    updated = replace(replica, paused_interactive=max(replica.paused_interactive + delta, 0))
    return replace(state, replicas=state.replicas.set(replica_id, updated))


def _holds_headroom(run: Run) -> bool:
    return run.phase is Phase.TOOL_PAUSED and run.service_class is ServiceClass.INTERACTIVE


def _unpause(state: State, run_id: str) -> State:
    """The run leaves TOOL_PAUSED: release the headroom it held against batch."""
    run = state.runs.get(run_id)
    if run is None or not _holds_headroom(run):
        return state
    return _bump_paused(state, run.replica, -1)


def _end_turn(state: State, turn_id: str, at: float, tool_calls: bool) -> State:
    turn = state.turns.get(turn_id)
    if turn is None:
        return state
    state = replace(state, turns=state.turns.delete(turn_id))
    replica = state.replicas.get(turn.replica)
    if replica is not None:
        replicas = state.replicas.set(replica.id, replace(replica, in_flight=replica.in_flight - 1))
        state = replace(state, replicas=replicas)
    if turn.single_pass:
        return state
    count = state.caller_in_flight.get(turn.caller, 0) - 1
    callers = (
        state.caller_in_flight.set(turn.caller, count)
        if count > 0
        else state.caller_in_flight.delete(turn.caller)
        if turn.caller in state.caller_in_flight
        else state.caller_in_flight
    )
    state = replace(state, caller_in_flight=callers)
    run = state.runs.get(turn.run_id)
    if run is None:
        return state
    left = max(run.turns_in_flight - 1, 0)
    phase = run.phase if left else (Phase.TOOL_PAUSED if tool_calls else Phase.IDLE)
    ended = replace(
        run,
        turns_in_flight=left,
        phase=phase,
        last_active=at,
        replica=turn.replica if not left else run.replica,
    )
    if ended.ended and not left:
        return replace(state, runs=state.runs.delete(run.id))
    state = replace(state, runs=state.runs.set(run.id, ended))
    return _bump_paused(state, ended.replica, 1) if _holds_headroom(ended) else state


def _forget_run(state: State, run_id: str) -> State:
    run = state.runs.get(run_id)
    if run is None:
        return state
    if run.turns_in_flight:
        return replace(state, runs=state.runs.set(run_id, replace(run, ended=True)))
    state = _unpause(state, run_id)
    return replace(state, runs=state.runs.delete(run_id))


# --- probes, time, resync ------------------------------------------------------------------


def _probe(state: State, ev: ProbeResult) -> State:
    replica = state.replicas.get(ev.replica_id)
    if replica is None:
        return state
    updated = replace(
        replica, healthy=ev.healthy, engine_running=ev.running, engine_waiting=ev.waiting
    )
    return replace(state, replicas=state.replicas.set(replica.id, updated))


def _tick(state: State, at: float) -> Decision:
    actions: list[Action] = []
    for turn in list(state.turns.values()):
        if at - turn.placed_at >= TURN_TIMEOUT_S:
            state = _end_turn(state, turn.id, at, tool_calls=False)
            actions.append(TurnExpired(turn_id=turn.id, replica_id=turn.replica))
    for run in list(state.runs.values()):
        if run.turns_in_flight == 0 and at - run.last_active >= RUN_IDLE_EXPIRY_S:
            state = _forget_run(state, run.id)
            actions.append(RunExpired(run_id=run.id))
    state, placed = _drain(state) if actions else (state, ())
    return state, (*actions, *placed)


def _resync(state: State, ev: Resync) -> State:
    """Replace this dataplane's turns and its runs with its report; recount what derives."""
    turns = {tid: t for tid, t in state.turns.items() if t.dataplane != ev.dataplane}
    for snap in ev.turns:
        if snap.replica in state.replicas:
            turns[snap.turn_id] = Turn(
                id=snap.turn_id,
                run_id=snap.run_id,
                replica=snap.replica,
                model=snap.model,
                service_class=snap.service_class,
                caller=snap.caller,
                placed_at=ev.at,
                dataplane=ev.dataplane,
                single_pass=not snap.run_id,
            )
    runs = dict(state.runs.items())
    for rs in ev.runs:
        runs[rs.run_id] = Run(
            id=rs.run_id,
            replica=rs.replica if rs.replica in state.replicas else "",
            phase=rs.phase,
            service_class=rs.service_class,
            caller=rs.caller,
            last_active=ev.at - rs.idle_seconds,
        )
    held = state.held.mutate()
    for tid in turns:
        if tid in held:
            del held[tid]
    return _recount(replace(state, held=held.finish()), turns, runs)


def _recount(state: State, turns: dict[str, Turn], runs: dict[str, Run]) -> State:
    """Rebuild every derived counter from the turns and runs themselves."""
    in_flight: dict[str, int] = {}
    paused: dict[str, int] = {}
    callers: dict[str, int] = {}
    per_run: dict[str, int] = {}
    for t in turns.values():
        in_flight[t.replica] = in_flight.get(t.replica, 0) + 1
        if not t.single_pass:
            callers[t.caller] = callers.get(t.caller, 0) + 1
            per_run[t.run_id] = per_run.get(t.run_id, 0) + 1
    for rid, run in runs.items():
        n = per_run.get(rid, 0)
        phase = (
            Phase.GENERATING if n else (Phase.IDLE if run.phase is Phase.GENERATING else run.phase)
        )
        runs[rid] = run = replace(run, turns_in_flight=n, phase=phase)
        if _holds_headroom(run) and run.replica:
            paused[run.replica] = paused.get(run.replica, 0) + 1
    replicas = {
        rid: replace(r, in_flight=in_flight.get(rid, 0), paused_interactive=paused.get(rid, 0))
        for rid, r in state.replicas.items()
    }
    return replace(
        state,
        turns=immutables.Map(turns),
        runs=immutables.Map(runs),
        replicas=immutables.Map(replicas),
        caller_in_flight=immutables.Map(callers),
    )
