"""Run and turn lifecycle bookkeeping of the decision core: how a turn's placement, a turn's
end or a run's end changes the run, the replica's counters, headroom and engine slots, and the
held-turn index.

Pure module: functions from State to State, no I/O. Each returns the buckets whose held turns
may fit because of the change; `decide` drains them.
"""

from __future__ import annotations

from luftpause.scheduler.core import expiry, queues, residency, slots
from luftpause.scheduler.core.events import RunTaken, TurnFinished
from luftpause.scheduler.core.learned import Comeback, comeback_keys, window_for
from luftpause.scheduler.core.model import (
    RUN_IDLE_EXPIRY_S,
    Bucket,
    HeldTurn,
    Phase,
    Replica,
    Run,
    ServiceClass,
    State,
    Turn,
    evolve,
    put,
)
from luftpause.scheduler.core.openings import OpeningIndex, record
from luftpause.scheduler.core.placement import set_replica


def bump_paused(state: State, replica_id: str, delta: int) -> State:
    """Change the count of interactive runs paused on a tool at `replica_id` by `delta`."""
    replica = state.replicas.get(replica_id)
    if replica is None:
        return state
    updated = evolve(replica, paused_interactive=max(replica.paused_interactive + delta, 0))
    return set_replica(state, updated)


def holds_headroom(run: Run) -> bool:
    """An interactive run paused on a tool: batch keeps a slot free for its return."""
    return run.phase is Phase.TOOL_PAUSED and run.service_class is ServiceClass.INTERACTIVE


def unpause(state: State, run_id: str) -> State:
    """The run leaves TOOL_PAUSED: release the headroom it held against batch."""
    run = state.runs.get(run_id)
    if run is None or not holds_headroom(run):
        return state
    return bump_paused(state, run.replica, -1)


def end_turn(
    state: State, turn: Turn, at: float, tool_calls: bool, usage: TurnFinished | None = None
) -> tuple[State, list[Bucket]]:
    """`turn` ended (`usage` when it finished with a reply, None when it failed or was lost)."""
    state = expiry.unorder_turn(put(state, turns=state.turns.delete(turn.id)), turn.order)
    replica = state.replicas.get(turn.replica)
    if replica is not None:
        interactive = turn.service_class is ServiceClass.INTERACTIVE
        updated = evolve(
            replica,
            in_flight=replica.in_flight - 1,
            interactive_in_flight=replica.interactive_in_flight - interactive,
        )
        if turn.slot >= 0:
            updated.__dict__["busy_slots"] = replica.busy_slots - {turn.slot}  # our own copy
        if usage is not None and 0 <= turn.started_at <= turn.first_token_at:
            uncached = max(usage.prompt_tokens - usage.cached_tokens, 0)
            ttft = turn.first_token_at - turn.started_at
            updated.__dict__["prefill"] = replica.prefill.add(uncached, ttft)  # our own copy
        state = set_replica(state, updated)
    if turn.single_pass:
        return state, []
    count = state.caller_in_flight.get(turn.caller, 0) - 1
    callers = state.caller_in_flight
    callers = (
        callers.set(turn.caller, count)
        if count > 0
        else callers.delete(turn.caller)
        if turn.caller in callers
        else callers
    )
    state = put(state, caller_in_flight=callers)
    run = state.runs.get(turn.run_id)
    if run is None:
        return state, []
    if usage is not None and usage.prompt_tokens > 0:
        state, run = _learn(state, run, turn, usage)
    left = max(run.turns_in_flight - 1, 0)
    if left:
        return put(state, runs=state.runs.set(run.id, evolve(run, turns_in_flight=left))), []
    if run.ended:
        state, run = residency.leave(state, run)
        return queues.rebucket_run(put(state, runs=state.runs.delete(run.id)), run.id)
    if run.resident and run.replica != turn.replica:  # its latest turn went elsewhere
        state, run = residency.leave(state, run)
    phase = Phase.TOOL_PAUSED if tool_calls else Phase.IDLE
    ended = evolve(run, turns_in_flight=0, phase=phase, last_active=at, replica=turn.replica)
    state = put(state, runs=state.runs.set(run.id, ended))
    if holds_headroom(ended):
        state = bump_paused(state, ended.replica, 1)
    state, ended = _stay(state, ended, at, tool_calls, counted=usage is not None)
    state = expiry.schedule_run_check(state, ended, at + RUN_IDLE_EXPIRY_S)
    return queues.rebucket_run(state, run.id)


def _learn(state: State, run: Run, turn: Turn, usage: TurnFinished) -> tuple[State, Run]:
    """Take a finished turn's usage into the run's context and the learned sizes."""
    sizes = state.sizes.turn(
        prompt_bytes=turn.prompt_bytes,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
    )
    if run.rounds and run.context_tokens:
        sizes = sizes.growth(usage.prompt_tokens - run.context_tokens)
    run = evolve(
        run,
        context_tokens=usage.prompt_tokens + usage.completion_tokens,
        shared_tokens=run.shared_tokens if run.rounds else usage.cached_tokens,
        rounds=run.rounds + 1,
    )
    before = residency.new_run_tokens(state)
    state = put(state, sizes=sizes, runs=state.runs.set(run.id, run))
    if run.rounds == 1:
        state = put(state, sizes=sizes.new_run(residency.footprint(state, run)))
    if residency.new_run_tokens(state) != before:
        state = residency.refresh_all(state)
    return state, run


def _stay(
    state: State, run: Run, at: float, tool_calls: bool, *, counted: bool
) -> tuple[State, Run]:
    """After its turn ended, keep `run` resident for as long as runs like it come back."""
    cls = str(run.service_class)
    if counted:
        comebacks = state.comebacks
        for key in comeback_keys(cls, tool_calls, run.rounds):
            comebacks = comebacks.set(key, comebacks.get(key, Comeback()).ended())
        state = put(state, comebacks=comebacks)
    window = window_for(state.comebacks, cls, tool_calls, run.rounds)
    if window <= 0:
        return residency.leave(state, run)
    tokens = residency.footprint(state, run) if run.context_tokens else run.footprint
    return residency.set_footprint(state, run, tokens, until=at + window)


def _came_back(state: State, run: Run, at: float) -> State:
    """`run`, which had ended a turn, sent its next one: learn how runs like it come back."""
    comebacks = state.comebacks
    tool_calls = run.phase is Phase.TOOL_PAUSED
    for key in comeback_keys(str(run.service_class), tool_calls, run.rounds):
        comebacks = comebacks.set(
            key, comebacks.get(key, Comeback()).returned(at - run.last_active)
        )
    return put(state, comebacks=comebacks)


def forget_run(state: State, run_id: str) -> tuple[State, list[Bucket]]:
    """Forget a run; return the buckets that may now fit (its headroom and held turns)."""
    run = state.runs.get(run_id)
    if run is None:
        return state, []
    if run.turns_in_flight:
        return put(state, runs=state.runs.set(run_id, evolve(run, ended=True))), []
    freed = queues.buckets_for_replica(state, run.replica) if holds_headroom(run) else []
    if run.resident:
        freed += queues.buckets_for_replica(state, run.replica)  # its KV is free for new runs
        state, run = residency.leave(state, run)
    state = unpause(state, run_id)
    state = put(state, runs=state.runs.delete(run_id))
    state, moved = queues.rebucket_run(state, run_id)
    return state, [*freed, *moved]


def start_turn(
    state: State, held: HeldTurn, replica: Replica, at: float, *, queued: bool = True
) -> tuple[State, list[Bucket], tuple[RunTaken, ...]]:
    """Place `held` on `replica`: counters, its run's phase and replica, queues re-bucketed.

    Returns the buckets that may now fit, and a `RunTaken` for the dataplane that served the
    run before if this turn came through another one.
    """
    if queued:
        state = queues.remove(state, held)
    state, order = expiry.order_turn(state, held.id)
    slot = slots.pick(state, replica, held.run_id) if replica.slots else None
    save, restore = (-1, -1) if slot is None else slots.offload(state, replica, slot, held.run_id)
    turn = Turn(
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
    )
    updated = evolve(
        replica,
        in_flight=replica.in_flight + 1,
        interactive_in_flight=replica.interactive_in_flight
        + (held.service_class is ServiceClass.INTERACTIVE),
    )
    if slot is not None:
        if save >= 0 or restore >= 0:
            holder = replica.slot_runs[slot]
            updated.__dict__.update(slots.keep(replica, save, restore, holder))  # our own copy
        updated.__dict__.update(slots.take(replica, slot, held.run_id))
    state = set_replica(put(state, turns=state.turns.set(turn.id, turn)), updated)
    if held.single_pass:
        return state, [], ()
    if held.opening:
        index = state.openings.get(replica.id, OpeningIndex())
        state = put(state, openings=state.openings.set(replica.id, record(index, held.opening)))
    old = state.runs.get(held.run_id)
    # A paused interactive run moving away frees the headroom it held on its old replica.
    freed = (
        queues.buckets_for_replica(state, old.replica)
        if old is not None and holds_headroom(old) and old.replica != replica.id
        else []
    )
    state = unpause(state, held.run_id)
    if old is not None and old.resident and old.replica != replica.id:
        freed += queues.buckets_for_replica(state, old.replica)  # its KV there is free now
        state, old = residency.leave(state, old)
    if old is not None and not old.turns_in_flight and old.rounds:
        state = _came_back(state, old, held.arrived_at)
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
    else:
        run = evolve(
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
    callers = state.caller_in_flight
    state = put(
        state,
        runs=state.runs.set(run.id, run),
        caller_in_flight=callers.set(held.caller, callers.get(held.caller, 0) + 1),
    )
    if not run.resident:
        tokens = (
            residency.footprint(state, run)
            if run.context_tokens
            else residency.first_footprint(state, held.prompt_bytes)
        )
        state, run = residency.set_footprint(state, run, tokens)
    state, moved = queues.rebucket_run(state, run.id)
    taken: tuple[RunTaken, ...] = ()
    if old is not None and old.dataplane and held.dataplane and old.dataplane != held.dataplane:
        taken = (RunTaken(dataplane=old.dataplane, run_id=run.id),)
    return state, [*freed, *moved], taken
