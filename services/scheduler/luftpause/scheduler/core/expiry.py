"""Expiry indexes: which turns and runs a tick must look at, without walking all of them.

Pure module: functions that change a `Draft`. Turns time out in placement order, so a
counter-keyed map read from its oldest end finds them (ended turns leave a gap that the head
skips once). Runs expire by idle time, which moves, so each run has one pending check in a
per-second bucket; a check that finds the run active again reschedules it. A tick therefore
costs what it expires plus the seconds since the last tick, not the number of live runs or
turns. `rebuild` makes both indexes again from the turns and runs alone.
"""

from __future__ import annotations

import math

import immutables

from luftpause.scheduler.core.model import RUN_IDLE_EXPIRY_S, TURN_TIMEOUT_S, Run, evolve
from luftpause.scheduler.core.state import Draft


def order_turn(d: Draft, turn_id: str) -> int:
    """Give a newly placed turn the next position in placement order."""
    order = d.turn_order_tail
    d.turn_order = d.turn_order.set(order, turn_id)
    d.turn_order_tail = order + 1
    return order


def unorder_turn(d: Draft, order: int) -> None:
    if order in d.turn_order:
        d.turn_order = d.turn_order.delete(order)


def timed_out_turns(d: Draft, at: float) -> list[str]:
    """Turn ids placed at least TURN_TIMEOUT_S ago, oldest first; the head moves past them."""
    out: list[str] = []
    head, tail = d.turn_order_head, d.turn_order_tail
    while head < tail:
        tid = d.turn_order.get(head)
        if tid is not None:
            turn = d.turns.get(tid)
            if turn is not None and at - turn.placed_at < TURN_TIMEOUT_S:
                break
            if turn is not None:
                out.append(tid)
        head += 1
    d.turn_order_head = head
    return out


def schedule_run_check(d: Draft, run: Run, due: float) -> Run:
    """Make sure `run` is checked at second ceil(`due`) (one pending check per run); the run
    as stored now."""
    second = math.ceil(due)
    if run.check_at != -1 and run.check_at <= second:
        return run  # an earlier check will reschedule it
    run = d.change_run(run, check_at=second)
    d.run_checks = d.run_checks.set(second, (run.id, d.run_checks.get(second)))
    cursor = d.run_check_cursor
    if cursor == -1 or second < cursor:
        d.run_check_cursor = second
    return run


def due_run_checks(d: Draft, at: float) -> list[str]:
    """Run ids whose pending check is due by `at`; their buckets are consumed."""
    cursor = d.run_check_cursor
    if cursor == -1 or cursor > at:
        return []
    out: list[str] = []
    checks = d.run_checks
    last = math.floor(at)
    for second in range(cursor, last + 1):
        chain = checks.get(second)
        if chain is None:
            continue
        checks = checks.delete(second)
        while chain is not None:
            rid, chain = chain
            run = d.runs.get(rid)
            if run is not None and run.check_at == second and rid not in out:
                out.append(rid)
    d.run_checks = checks
    d.run_check_cursor = last + 1 if len(checks) else -1
    return out


def idle_expired(run: Run, at: float) -> bool:
    return run.turns_in_flight == 0 and at - run.last_active >= RUN_IDLE_EXPIRY_S


def check_due(run: Run, at: float) -> float:
    """When a run's idle expiry is checked next: its idle time runs from its last turn's end,
    or from now while a turn of it is in flight."""
    return (run.last_active if run.turns_in_flight == 0 else at) + RUN_IDLE_EXPIRY_S


def rebuild(d: Draft, at: float) -> None:
    """Both indexes again: turns numbered by placement time, every run checked once."""
    turns = sorted(d.turns.values(), key=lambda t: (t.placed_at, t.order, t.id))
    turn_map = d.turns
    order: dict[int, str] = {}
    for n, t in enumerate(turns):
        if t.order != n:
            turn_map = turn_map.set(t.id, evolve(t, order=n))
        order[n] = t.id
    d.turns = turn_map
    d.turn_order = immutables.Map(order)
    d.turn_order_head = 0
    d.turn_order_tail = len(order)
    d.run_checks = immutables.Map()
    d.run_check_cursor = -1
    for run in list(d.runs.values()):
        if run.check_at != -1:
            run = evolve(run, check_at=-1)
            d.runs = d.runs.set(run.id, run)
        schedule_run_check(d, run, check_due(run, at))
