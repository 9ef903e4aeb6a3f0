"""Expiry indexes: which turns and runs a tick must look at, without walking all of them.

Pure module. Turns time out in placement order, so a counter-keyed map read from its oldest
end finds them (ended turns leave a gap that the head skips once). Runs expire by idle time,
which moves, so each run has one pending check in a per-second bucket; a check that finds the
run active again reschedules it. A tick therefore costs what it expires plus the seconds since
the last tick, not the number of live runs or turns.
"""

from __future__ import annotations

import math

from luftpause.scheduler.core.model import (
    RUN_IDLE_EXPIRY_S,
    TURN_TIMEOUT_S,
    Run,
    State,
    evolve,
    put,
)


def order_turn(state: State, turn_id: str) -> tuple[State, int]:
    """Give a newly placed turn the next position in placement order."""
    order = state.turn_order_tail
    return put(
        state, turn_order=state.turn_order.set(order, turn_id), turn_order_tail=order + 1
    ), order


def unorder_turn(state: State, order: int) -> State:
    if order in state.turn_order:
        return put(state, turn_order=state.turn_order.delete(order))
    return state


def timed_out_turns(state: State, at: float) -> tuple[State, list[str]]:
    """Turn ids placed at least TURN_TIMEOUT_S ago, oldest first; the head moves past them."""
    out: list[str] = []
    head, tail = state.turn_order_head, state.turn_order_tail
    while head < tail:
        tid = state.turn_order.get(head)
        if tid is not None:
            turn = state.turns.get(tid)
            if turn is not None and at - turn.placed_at < TURN_TIMEOUT_S:
                break
            if turn is not None:
                out.append(tid)
        head += 1
    if head == state.turn_order_head:
        return state, out
    return put(state, turn_order_head=head), out


def schedule_run_check(state: State, run: Run, due: float) -> State:
    """Make sure `run` is checked at second ceil(`due`) (one pending check per run)."""
    second = math.ceil(due)
    if run.check_at != -1 and run.check_at <= second:
        return state  # an earlier check will reschedule it
    chain = state.run_checks.get(second)
    cursor = state.run_check_cursor
    return put(
        state,
        runs=state.runs.set(run.id, evolve(run, check_at=second)),
        run_checks=state.run_checks.set(second, (run.id, chain)),
        run_check_cursor=second if cursor == -1 or second < cursor else cursor,
    )


def due_run_checks(state: State, at: float) -> tuple[State, list[str]]:
    """Run ids whose pending check is due by `at`; their buckets are consumed."""
    cursor = state.run_check_cursor
    if cursor == -1 or cursor > at:
        return state, []
    out: list[str] = []
    checks = state.run_checks
    last = math.floor(at)
    for second in range(cursor, last + 1):
        chain = checks.get(second)
        if chain is None:
            continue
        checks = checks.delete(second)
        while chain is not None:
            rid, chain = chain
            run = state.runs.get(rid)
            if run is not None and run.check_at == second and rid not in out:
                out.append(rid)
    nxt = last + 1 if len(checks) else -1
    return put(state, run_checks=checks, run_check_cursor=nxt), out


def idle_expired(run: Run, at: float) -> bool:
    return run.turns_in_flight == 0 and at - run.last_active >= RUN_IDLE_EXPIRY_S
