"""Run and turn lifecycle of the decision core: how a turn's placement, a turn's end or a run's
end changes the run, the counters, the engine slots, residency and the held-turn index.

Pure module: functions that change a `Draft`, no I/O. Each returns the buckets its held turns
moved to; room a change opens on a replica is noted by `placement.set_replica` in
`Draft.opened`, and `decide` drains both.
"""

from __future__ import annotations

from luftpause.scheduler.core import counters, expiry, gate, queues, residency, shares, slots
from luftpause.scheduler.core.cost import prefill
from luftpause.scheduler.core.counters import holds_headroom
from luftpause.scheduler.core.events import RunTaken, TurnFinished
from luftpause.scheduler.core.learned import comeback_keys, ended, returned, window_for
from luftpause.scheduler.core.model import (
    Bucket,
    HeldTurn,
    Phase,
    Replica,
    Run,
    Turn,
    build,
)
from luftpause.scheduler.core.openings import OpeningIndex, record
from luftpause.scheduler.core.placement import update_replica
from luftpause.scheduler.core.state import Draft

_NO_INDEX = OpeningIndex()


def start_turn(
    d: Draft, held: HeldTurn, replica: Replica, at: float, *, queued: bool = True
) -> tuple[list[Bucket], tuple[RunTaken, ...]]:
    """Place `held` on `replica`: counters, its run's phase, replica and residency, its held
    turns re-bucketed. Returns those buckets, and a `RunTaken` for the dataplane that served
    the run before if this turn came through another one.
    """
    if queued:
        queues.remove(d, held)
    order = expiry.order_turn(d, held.id)
    slot = slots.pick(d, replica, held.run_id) if replica.slots else None
    save, restore = (-1, -1) if slot is None else slots.offload(d, replica, slot, held.run_id)
    turn = build(
        Turn,
        id=held.id,
        run_id=held.run_id,
        replica=replica.id,
        model=held.model,
        service_class=held.service_class,
        caller=held.caller,
        placed_at=at,
        dataplane=held.dataplane,
        single_pass=held.single_pass,
        order=order,
        slot=-1 if slot is None else slot,
        save_to=save,
        restore_from=restore,
        prompt_bytes=held.prompt_bytes,
        windows=()
        if held.key is None and not d.window_of
        else gate.windows_of_turn(d, held, replica.id),
        max_tokens=held.max_tokens,
        prefill_tokens=prefill(d, held, d.runs.get(held.run_id), replica),
    )
    changes = counters.on_place(replica, turn)
    shares.placed(d, turn, at, 1)
    if slot is not None:
        if save >= 0 or restore >= 0:
            changes.update(slots.keep(replica, save, restore, replica.slot_runs[slot]))
        changes["slot_runs"] = slots.take(replica, slot, held.run_id)
    d.turns = d.turns.set(turn.id, turn)
    update_replica(d, replica, **changes)
    if held.single_pass:
        return [], ()
    if held.opening and d.rules.openings:
        index = d.openings.get(replica.id, _NO_INDEX)
        d.openings = d.openings.set(replica.id, record(index, held.opening))
    counters.add_caller(d, held.caller, 1)
    old = d.runs.get(held.run_id)
    taken: tuple[RunTaken, ...] = ()
    if old is not None and old.dataplane and held.dataplane and old.dataplane != held.dataplane:
        taken = (RunTaken(dataplane=old.dataplane, run_id=old.id),)
    run = _generating(d, old, held, replica, at)  # may change `old` in place
    if not run.resident:
        tokens = (
            residency.footprint(d, run)
            if run.context_tokens
            else residency.first_footprint(d, held.prompt_bytes)
        )
        run = residency.set_footprint(d, run, tokens)
    return queues.rebucket_run(d, run.id), taken


def _generating(d: Draft, old: Run | None, held: HeldTurn, replica: Replica, at: float) -> Run:
    """The turn's run, now generating on `replica` (stored)."""
    if old is None:
        run = Run(
            id=held.run_id,
            replica=replica.id,
            phase=Phase.GENERATING,
            service_class=held.service_class,
            caller=held.caller,
            turns_in_flight=1,
            last_active=at,
            dataplane=held.dataplane,
        )
        d.runs = d.runs.set(run.id, d.adopt(run))
        return run
    if holds_headroom(d, old):  # it leaves its tool call: the slot kept for it is free
        counters.bump_paused(d, old.replica, -1)
    if old.resident and old.replica != replica.id:
        old = residency.leave(d, old)  # it moves: its KV there is free now
    return d.change_run(
        old,
        replica=replica.id,
        phase=Phase.GENERATING,
        service_class=held.service_class,
        caller=held.caller,
        turns_in_flight=old.turns_in_flight + 1,
        last_active=at,
        ended=False,
        dataplane=held.dataplane or old.dataplane,
    )


def end_turn(
    d: Draft, turn: Turn, at: float, tool_calls: bool, usage: TurnFinished | None = None
) -> list[Bucket]:
    """`turn` ended (`usage` when it finished with a reply, None when it failed or was lost).
    Returns the buckets its run's held turns moved to."""
    d.turns = d.turns.delete(turn.id)
    expiry.unorder_turn(d, turn.order)
    shares.placed(d, turn, at, -1)
    if turn.windows:
        spent = None if usage is None else (usage.prompt_tokens, usage.completion_tokens)
        gate.settle(d, turn, at, spent, finished=usage is not None)
    replica = d.replicas.get(turn.replica)
    if replica is not None:
        changes = counters.on_end(replica, turn)
        if usage is not None and 0 <= turn.started_at <= turn.first_token_at:
            uncached = max(usage.prompt_tokens - usage.cached_tokens, 0)
            ttft = turn.first_token_at - turn.started_at
            changes["prefill"] = replica.prefill.add(uncached, ttft)
            read = residency.fastest_read(replica.read_s_per_token, uncached, ttft)
            changes["read_s_per_token"] = read
            changes["spills"] = residency.spills(d, replica, read)
        update_replica(d, replica, **changes)
    if turn.single_pass:
        return []
    counters.add_caller(d, turn.caller, -1)
    run = d.runs.get(turn.run_id)
    if run is None:
        return []
    if usage is not None and usage.prompt_tokens > 0:
        run = _learn(d, run, turn, usage)
    if run.turns_in_flight > 1:
        d.change_run(run, turns_in_flight=run.turns_in_flight - 1)
        return []
    if run.ended:
        residency.leave(d, run)
        d.runs = d.runs.delete(run.id)
        return queues.rebucket_run(d, run.id)
    if run.resident and run.replica != turn.replica:  # its latest turn went elsewhere
        run = residency.leave(d, run)
    phase = Phase.TOOL_PAUSED if tool_calls else Phase.IDLE
    run = d.change_run(
        run, turns_in_flight=0, phase=phase, last_active=at, replica=turn.replica, back=False
    )
    if holds_headroom(d, run):
        counters.bump_paused(d, run.replica, 1)
    run = _stay(d, run, at, tool_calls, counted=usage is not None)
    expiry.schedule_run_check(d, run, expiry.check_due(run, at))
    return queues.rebucket_run(d, run.id)


def _learn(d: Draft, run: Run, turn: Turn, usage: TurnFinished) -> Run:
    """Take a finished turn's usage into the run's context and the learned sizes."""
    sizes = d.sizes.turn(
        prompt_bytes=turn.prompt_bytes,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
    )
    if run.rounds and run.context_tokens:
        sizes = sizes.growth(usage.prompt_tokens - run.context_tokens)
    run = d.change_run(
        run,
        context_tokens=usage.prompt_tokens + usage.completion_tokens,
        shared_tokens=run.shared_tokens if run.rounds else usage.cached_tokens,
        rounds=run.rounds + 1,
    )
    before = residency.new_run_tokens(d)
    d.sizes = sizes
    if run.rounds == 1:
        d.sizes = sizes.new_run(residency.footprint(d, run))
    if residency.new_run_tokens(d) != before:
        residency.refresh_all(d)
    return run


def _stay(d: Draft, run: Run, at: float, tool_calls: bool, *, counted: bool) -> Run:
    """After its turn ended, keep `run` resident for as long as runs like it come back."""
    cls = str(run.service_class)
    if counted:
        comebacks = d.comebacks
        for key in comeback_keys(cls, tool_calls, run.rounds):
            comebacks = comebacks.set(key, ended(comebacks.get(key)))
        d.comebacks = comebacks
    window = window_for(d.comebacks, cls, tool_calls, run.rounds)
    if window <= 0:
        return residency.leave(d, run)
    tokens = residency.footprint(d, run) if run.context_tokens else run.footprint
    return residency.set_footprint(d, run, tokens, until=at + window)


def arrived(d: Draft, run_id: str, at: float) -> None:
    """A turn of `run_id` arrived at `at`: if it is the run's first since its last turn ended,
    learn how runs like it come back. Counted when the turn arrives, not when it is placed: a
    pool that holds turns would learn each return as late as it held it, and every end in
    between would count as one that did not come back (a pool of 2-slot engines, held turns
    waiting ten seconds: runs ending their second round were learned to come back one time in
    ten, so none stayed resident and two in five moved to the other replica)."""
    run = d.runs.get(run_id)
    if run is None or run.back or run.turns_in_flight or not run.rounds:
        return
    _came_back(d, run, at)
    d.change_run(run, back=True)


def _came_back(d: Draft, run: Run, at: float) -> None:
    """`run`, which had ended a turn, sent its next one: learn how runs like it come back."""
    comebacks = d.comebacks
    tool_calls = run.phase is Phase.TOOL_PAUSED
    gap = at - run.last_active
    for key in comeback_keys(str(run.service_class), tool_calls, run.rounds):
        comebacks = comebacks.set(key, returned(comebacks.get(key), gap))
    d.comebacks = comebacks


def forget_run(d: Draft, run_id: str) -> list[Bucket]:
    """Forget a run; return the buckets its held turns moved to (its replica's room for new
    runs and its headroom go through `Draft.opened`)."""
    run = d.runs.get(run_id)
    if run is None:
        return []
    if run.turns_in_flight:
        d.change_run(run, ended=True)
        return []
    if holds_headroom(d, run):
        counters.bump_paused(d, run.replica, -1)
    residency.leave(d, run)
    d.runs = d.runs.delete(run_id)
    return queues.rebucket_run(d, run_id)
