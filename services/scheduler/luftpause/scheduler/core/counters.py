"""Counters derived from the turns and runs: how loaded each replica and caller is.

Pure module. Owns, per replica, the turns in flight (all, and interactive), the prompt tokens
its turns in flight have yet to show a first token for (`pending_prefill`), the engine slots
with a turn in flight and the interactive runs paused on a tool there (when the `headroom` rule
is on); per caller, its turns in flight; per run, its turns in flight. Placing or ending a turn
changes them by `on_place` and `on_end` (the replica's changed fields, for the caller to apply
with its other changes in one copy), a first token by `first_token`, and `add_caller`;
`rebuild` counts them all again from the turns and runs (Resync, and the property tests, which
check after every step that the counts equal the rebuild)."""

from __future__ import annotations

import immutables

from luftpause.scheduler.core.model import Phase, Replica, Run, ServiceClass, Turn, evolve
from luftpause.scheduler.core.placement import set_replica, update_replica
from luftpause.scheduler.core.state import Draft, View


def on_place(replica: Replica, turn: Turn) -> dict[str, object]:
    """The replica's counters once `turn` is placed there."""
    changes: dict[str, object] = {
        "in_flight": replica.in_flight + 1,
        "pending_prefill": replica.pending_prefill + turn.prefill_tokens,
    }
    if turn.service_class is ServiceClass.INTERACTIVE:
        changes["interactive_in_flight"] = replica.interactive_in_flight + 1
    if turn.slot >= 0:
        changes["busy_slots"] = replica.busy_slots | {turn.slot}
    return changes


def on_end(replica: Replica, turn: Turn) -> dict[str, object]:
    """The replica's counters once `turn`, placed there, ended."""
    changes: dict[str, object] = {"in_flight": replica.in_flight - 1}
    if turn.first_token_at < 0 and turn.prefill_tokens:
        changes["pending_prefill"] = replica.pending_prefill - turn.prefill_tokens
    if turn.service_class is ServiceClass.INTERACTIVE:
        changes["interactive_in_flight"] = replica.interactive_in_flight - 1
    if turn.slot >= 0:
        changes["busy_slots"] = replica.busy_slots - {turn.slot}
    return changes


def first_token(d: Draft, turn_id: str) -> None:
    """A placed turn's first token came: its prompt is read, no longer pending (call before
    the turn is stamped)."""
    turn = d.turns.get(turn_id)
    if turn is None or turn.first_token_at >= 0 or not turn.prefill_tokens:
        return
    replica = d.replicas.get(turn.replica)
    if replica is not None:
        pending = replica.pending_prefill - turn.prefill_tokens
        update_replica(d, replica, pending_prefill=pending)


def add_caller(d: Draft, caller: str, delta: int) -> None:
    """A turn of `caller` was placed (+1) or ended (-1)."""
    callers = d.caller_in_flight
    count = callers.get(caller, 0) + delta
    if count > 0:
        d.caller_in_flight = callers.set(caller, count)
    elif caller in callers:
        d.caller_in_flight = callers.delete(caller)


def holds_headroom(view: View, run: Run) -> bool:
    """An interactive run paused on a tool, with the `headroom` rule on: batch keeps a slot
    free for its return."""
    return (
        view.rules.headroom
        and run.phase is Phase.TOOL_PAUSED
        and run.service_class is ServiceClass.INTERACTIVE
    )


def bump_paused(d: Draft, replica_id: str, delta: int) -> None:
    """Change the count of interactive runs paused on a tool at `replica_id` by `delta`."""
    replica = d.replicas.get(replica_id)
    if replica is not None:
        paused = max(replica.paused_interactive + delta, 0)
        update_replica(d, replica, paused_interactive=paused)


def rebuild(d: Draft) -> None:
    """Every counter, counted again from the turns and runs."""
    in_flight: dict[str, int] = {}
    interactive: dict[str, int] = {}
    pending: dict[str, int] = {}
    busy: dict[str, frozenset[int]] = {}
    callers: dict[str, int] = {}
    per_run: dict[str, int] = {}
    for t in d.turns.values():
        in_flight[t.replica] = in_flight.get(t.replica, 0) + 1
        if t.first_token_at < 0:
            pending[t.replica] = pending.get(t.replica, 0) + t.prefill_tokens
        if t.service_class is ServiceClass.INTERACTIVE:
            interactive[t.replica] = interactive.get(t.replica, 0) + 1
        if t.slot >= 0:
            busy[t.replica] = busy.get(t.replica, frozenset()) | {t.slot}
        if not t.single_pass:
            callers[t.caller] = callers.get(t.caller, 0) + 1
            per_run[t.run_id] = per_run.get(t.run_id, 0) + 1
    paused: dict[str, int] = {}
    runs = d.runs
    for run in list(runs.values()):
        n = per_run.get(run.id, 0)
        if run.turns_in_flight != n:
            runs = runs.set(run.id, evolve(run, turns_in_flight=n))
        if holds_headroom(d, run) and run.replica:
            paused[run.replica] = paused.get(run.replica, 0) + 1
    d.runs = runs
    d.caller_in_flight = immutables.Map(callers)
    for rid, replica in d.replicas.items():
        counts = {
            "in_flight": in_flight.get(rid, 0),
            "interactive_in_flight": interactive.get(rid, 0),
            "pending_prefill": pending.get(rid, 0),
            "busy_slots": busy.get(rid, frozenset()),
            "paused_interactive": paused.get(rid, 0),
        }
        if any(getattr(replica, name) != value for name, value in counts.items()):
            set_replica(d, evolve(replica, **counts))
