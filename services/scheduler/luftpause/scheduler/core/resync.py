"""Resync: a dataplane's report replaces what the scheduler believed about its runs and turns.

Pure module. The dataplane's turns in flight replace the ones the scheduler had for it, the
runs it reports replace the scheduler's records of them, and every derived counter and index is
rebuilt from the records themselves, so the state after a Resync is exactly what the dataplanes
reported. O(runs + turns): it happens once per (re)connect.
"""

from __future__ import annotations

import immutables

from luftpause.scheduler.core import expiry, queues, residency
from luftpause.scheduler.core.events import Resync
from luftpause.scheduler.core.model import (
    RUN_IDLE_EXPIRY_S,
    DataplaneLink,
    HeldTurn,
    Phase,
    Run,
    ServiceClass,
    State,
    Turn,
    evolve,
    put,
)
from luftpause.scheduler.core.placement import count_room


def resync(state: State, ev: Resync) -> State:
    turns = {tid: t for tid, t in state.turns.items() if t.dataplane != ev.dataplane}
    for snap in ev.turns:
        if snap.replica in state.replicas:
            known = state.turns.get(snap.turn_id)
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
                # The slot it was given, if this scheduler placed it (not after a restart).
                slot=known.slot if known is not None and known.replica == snap.replica else -1,
            )
    runs = dict(state.runs.items())
    for rs in ev.runs:
        replica = rs.replica if rs.replica in state.replicas else ""
        was = state.runs.get(rs.run_id)
        # What this scheduler learned of the run's context stays while it stays where it was.
        kept = was if was is not None and was.replica == replica else Run(id=rs.run_id)
        runs[rs.run_id] = Run(
            id=rs.run_id,
            replica=replica,
            phase=rs.phase,
            service_class=rs.service_class,
            caller=rs.caller,
            last_active=ev.at - rs.idle_seconds,
            dataplane=ev.dataplane,
            context_tokens=kept.context_tokens,
            shared_tokens=kept.shared_tokens,
            rounds=kept.rounds,
            footprint=kept.footprint if replica else 0,
            resident_until=kept.resident_until,
        )
    held = {tid: h for tid, h in state.held.items() if tid not in turns}
    link = state.dataplanes.get(ev.dataplane, DataplaneLink())
    state = put(
        state,
        dataplanes=state.dataplanes.set(
            ev.dataplane, DataplaneLink(streams=link.streams, gone_since=None)
        ),
    )
    return _rebuild(state, turns, runs, held, ev.at)


def _rebuild(
    state: State, turns: dict[str, Turn], runs: dict[str, Run], held: dict[str, HeldTurn], at: float
) -> State:
    """Every derived counter and index, recomputed from turns, runs and held turns."""
    in_flight: dict[str, int] = {}
    interactive: dict[str, int] = {}
    paused: dict[str, int] = {}
    callers: dict[str, int] = {}
    per_run: dict[str, int] = {}
    ordered: dict[int, str] = {}
    for n, t in enumerate(sorted(turns.values(), key=lambda t: (t.placed_at, t.id))):
        turns[t.id] = t = evolve(t, order=n)
        ordered[n] = t.id
        in_flight[t.replica] = in_flight.get(t.replica, 0) + 1
        if t.service_class is ServiceClass.INTERACTIVE:
            interactive[t.replica] = interactive.get(t.replica, 0) + 1
        if not t.single_pass:
            callers[t.caller] = callers.get(t.caller, 0) + 1
            per_run[t.run_id] = per_run.get(t.run_id, 0) + 1
    for rid, run in runs.items():
        n = per_run.get(rid, 0)
        phase = (
            Phase.GENERATING if n else (Phase.IDLE if run.phase is Phase.GENERATING else run.phase)
        )
        runs[rid] = run = evolve(run, turns_in_flight=n, phase=phase, check_at=-1)
        if run.footprint and not n and run.resident_until <= 0:
            # Its turns were lost: nothing says when it is back, so it is not resident.
            runs[rid] = run = evolve(run, footprint=0)
        if (
            run.phase is Phase.TOOL_PAUSED
            and run.service_class is ServiceClass.INTERACTIVE
            and run.replica
        ):
            paused[run.replica] = paused.get(run.replica, 0) + 1
    busy: dict[str, frozenset[int]] = {}
    for t in turns.values():
        if t.slot >= 0:
            busy[t.replica] = busy.get(t.replica, frozenset()) | {t.slot}
    replicas = {
        rid: evolve(
            r,
            in_flight=in_flight.get(rid, 0),
            interactive_in_flight=interactive.get(rid, 0),
            paused_interactive=paused.get(rid, 0),
            busy_slots=busy.get(rid, frozenset()),
        )
        for rid, r in state.replicas.items()
    }
    state = put(
        state,
        turns=immutables.Map(turns),
        runs=immutables.Map(runs),
        replicas=immutables.Map(replicas),
        caller_in_flight=immutables.Map(callers),
        turn_order=immutables.Map(ordered),
        turn_order_head=0,
        turn_order_tail=len(ordered),
        run_checks=immutables.Map(),
        run_check_cursor=-1,
        residency_checks=immutables.Map(),
        residency_cursor=-1,
        held=immutables.Map(),
        queues=immutables.Map(),
        heads=immutables.Map(),
        held_by_run=immutables.Map(),
    )
    state = residency.rebuild(count_room(state))
    for run in runs.values():
        since = run.last_active if run.turns_in_flight == 0 else at
        state = expiry.schedule_run_check(state, state.runs[run.id], since + RUN_IDLE_EXPIRY_S)
    for h in sorted(held.values(), key=lambda h: h.seq):
        bucket = queues.bucket_of(state, h.run_id, h.model, h.single_pass, h.overdue)
        state = queues.add(state, evolve(h, bucket=bucket))
    return state
