"""Checks the core's state machine test applies after each step (see test_core_invariants)."""

from __future__ import annotations

from collections import Counter

from luftpause.scheduler.core import residency
from luftpause.scheduler.core.events import (
    Event,
    Place,
    Resync,
    RunEnded,
    Tick,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
)
from luftpause.scheduler.core.model import (
    NEW_RUN_MAX_HOLD_S,
    HeldTurn,
    Run,
    ServiceClass,
    State,
    Turn,
    draft,
)


def stays_home(state: State, run: Run) -> bool:
    """Pinned (generating, paused on a tool) or resident: its turns wait for its replica."""
    return state.affinity and bool(run.replica) and (run.pinned or run.footprint > 0)


def kv_allows(pool: int | None, resident: int, new_run: int, cls: ServiceClass) -> bool:
    """The KV rule: a new run starts while it and the resident runs fit in 87.5 % of the pool
    (batch in 75 %), or when nothing is resident."""
    if pool is None or resident <= 0:
        return True
    share = 0.875 if cls is ServiceClass.INTERACTIVE else 0.75
    return resident + new_run <= share * pool


def may_unpin(before: State, event: Event, run_id: str) -> bool:
    """Whether `event` itself may legitimately leave the run idle, free it or forget it."""
    if isinstance(event, Tick | Resync):
        return True
    if isinstance(event, RunEnded):
        return event.run_id == run_id
    if isinstance(event, TurnFinished | TurnFailed | TurnAbandoned):
        turn = before.turns.get(event.turn_id)
        return turn is not None and turn.run_id == run_id
    return False


def could_take(state: State, held: HeldTurn, replica_id: str) -> bool:
    """Whether `held` may go to `replica_id` at all (ignoring room)."""
    replica = state.replicas[replica_id]
    if not replica.healthy or held.model not in replica.models:
        return False
    run = state.runs.get(held.run_id)
    if run is not None and stays_home(state, run):
        if run.replica == replica_id:
            return True
        home = state.replicas.get(run.replica)
        if home is not None and home.healthy and held.model in home.models:
            return False
    return held.overdue or replica.new_fits(held.service_class)


def after_turns(state: State, run_id: str) -> list[Turn]:
    return [t for t in state.turns.values() if t.run_id == run_id]


def check_residency(state: State) -> None:
    """Resident tokens and new-run flags equal their rebuild from the runs."""
    totals: Counter[str] = Counter()
    for run in state.runs.values():
        if run.footprint:
            assert run.replica in state.replicas, f"{run.id} resident on no replica"
            totals[run.replica] += run.footprint
    new_run = residency.new_run_tokens(state)
    rebuilt = residency.rebuild(draft(state))
    for rid, replica in state.replicas.items():
        assert replica.resident_tokens == totals[rid], f"{rid}: resident tokens drifted"
        flags = (replica.new_batch_fits, replica.new_interactive_fits)
        expected = tuple(
            kv_allows(replica.kv_tokens, totals[rid], new_run, cls)
            for cls in (ServiceClass.BATCH, ServiceClass.INTERACTIVE)
        )
        assert flags == expected, f"{rid}: stale new-run fits"
        assert rebuilt.replicas[rid] == replica, f"{rid}: differs from its rebuild"


def check_kv_rule(before: State, after: State, event: Event, places: list[Place]) -> None:
    """A new run (one resident nowhere, not held past NEW_RUN_MAX_HOLD_S) started only where it
    fit beside the runs resident there. The resident tokens just before each placement are those
    after the step less the footprints added by the placements there later in the step (runs
    held past the longest hold add theirs unchecked); a replica a run moved away from during
    the step is not checked (its total also fell)."""
    moved_from: set[str] = set()
    added: dict[str, list[tuple[ServiceClass, int, bool]]] = {}
    seen: set[str] = set()
    for action in places:
        turn = after.turns[action.turn_id]
        run = before.runs.get(turn.run_id)
        if turn.run_id in seen or turn.single_pass:
            continue
        seen.add(turn.run_id)
        if run is not None and run.resident and run.replica != action.replica_id:
            moved_from.add(run.replica)
        if run is not None and (run.pinned or run.resident) and run.replica == action.replica_id:
            continue  # resident there already: never held by the rule, adds nothing
        held = before.held.get(turn.id)
        overdue = held is not None and (
            held.overdue
            or (isinstance(event, Tick) and event.at - held.arrived_at >= NEW_RUN_MAX_HOLD_S)
        )
        footprint = after.runs[turn.run_id].footprint if turn.run_id in after.runs else 0
        added.setdefault(action.replica_id, []).append((turn.service_class, footprint, not overdue))
    new_run = residency.new_run_tokens(after)
    for rid, placed in added.items():
        replica = after.replicas[rid]
        if replica.kv_tokens is None or rid in moved_from:
            continue
        total = replica.resident_tokens
        for cls, footprint, checked in reversed(placed):
            total -= footprint
            if checked:
                ok = kv_allows(replica.kv_tokens, total, new_run, cls)
                assert ok, f"a new {cls} run started on {rid} past its KV pool"
