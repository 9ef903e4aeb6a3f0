"""Runs resident on a replica, and the KV rule that keeps a replica's working set in its pool.

Pure module: functions that change a `Draft`, no I/O. Theory of operation:

- A run is *resident* on its replica while its context is expected to be used there again:
  while a turn of it is in flight, while it is paused on a tool, and after a turn that ended
  without tool calls for as long as runs of its class that end that way are seen to come back
  (`learned.Comeback.window`; 0 for runs that rarely come back). Its *footprint* is the KV its
  context needs there: its context less the part its first turn found cached (a preamble it
  shares with other runs, held once for all of them), plus what the next round is expected to
  add (learned). Before its first turn is reported, a new run's footprint is estimated from the
  size of its request.
- `Replica.resident_tokens` is the sum of the footprints of the runs resident there. An idle
  resident run's next turn waits for its replica like a pinned one's (soft affinity): its
  prefix is there. If it waits longer than reading its context elsewhere would take, it gives
  up its residency and may move (`upkeep.tick`).
- The KV rule (`Rules.kv_rule`): on a replica whose KV pool is known, a new run (or one that is
  resident nowhere) starts only while the resident footprints and the learned footprint of a
  new run fit in a share of the pool: KV_MARGIN_BATCH for a batch run, KV_MARGIN_INTERACTIVE
  for an interactive one (the rest is headroom for the engine's own cache churn), or while
  nothing placed there waits to be read and the replica `spills`: it reads its margin's worth
  of contexts again in less time than a paused run is away (its fitted prefill time per token,
  the learned gap of runs that come back), so the contexts the new run pushes out are read
  again before they are needed and holding it would only leave the engine's batch short.
  Where reading is slower than that (a 36k-token pool read at 0.1 ms a token, runs away 2 s),
  runs past the margin evict each other's contexts faster than they can be read again, and
  the rule holds new runs even on an engine with nothing queued. A replica with nothing
  resident always takes one, so no run is too big to ever start. Turns of resident
  runs are never held by this rule: they fit by construction, and holding them would only add
  their wait to a full engine. Without it, runs whose contexts add up to more than the pool
  evict each other's prefixes while they wait on tools, and every turn re-reads its context. A
  new run is held only while no replica has room; where it goes among those with room is
  `cost`'s choice, which counts a replica's overflow as tokens to read again.

Every function keeps `resident_tokens` and the replica's `new_*_fits` flags in step with the
runs; `rebuild` recomputes them from the runs alone (resync, and the property tests).
"""

from __future__ import annotations

import math

import immutables

from luftpause.scheduler.core.learned import pause_s
from luftpause.scheduler.core.model import (
    KV_MARGIN_BATCH,
    KV_MARGIN_INTERACTIVE,
    RESIDENCY_STEP_S,
    Phase,
    Replica,
    Run,
)
from luftpause.scheduler.core.placement import update_replica
from luftpause.scheduler.core.state import Draft, View


def footprint(view: View, run: Run) -> int:
    """The KV `run`'s context needs on its replica, with its next round (at least 1)."""
    own = max(run.context_tokens - run.shared_tokens, 0)
    return max(own + view.sizes.next_round, 1)


def first_footprint(view: View, prompt_bytes: int) -> int:
    """A new run's footprint before any usage is reported: its request, sized by bytes."""
    return view.sizes.first_footprint(prompt_bytes)


def new_run_tokens(view: View) -> int:
    """What a new run is expected to need (0 until one has been seen)."""
    return round(view.sizes.new_run_tokens)


def fits(replica: Replica, resident: int, new_run: int) -> tuple[bool, bool]:
    """Whether a new batch and a new interactive run may start on `replica` (the KV rule)."""
    pool = replica.kv_tokens
    if pool is None or resident <= 0:
        return True, True
    need = resident + new_run
    return need <= KV_MARGIN_BATCH * pool, need <= KV_MARGIN_INTERACTIVE * pool


def fastest_read(fastest: float | None, uncached: int, ttft_s: float) -> float | None:
    """The least seconds per uncached prompt token seen, with a turn that read `uncached`
    tokens in `ttft_s` to its first token. A turn's time to first token is the engine's
    reading of it plus whatever it waited for (other prompts, a full batch, the decode steps
    of the others): never less than the reading, so the least per token seen is the engine's
    own speed, where a fit over every turn counts the queue as reading (two to three times
    the engine's speed on a busy KV-bound pool)."""
    if uncached <= 0 or ttft_s <= 0:
        return fastest
    per_token = ttft_s / uncached
    return per_token if fastest is None else min(fastest, per_token)


def spills(view: View, replica: Replica, read_s_per_token: float | None) -> bool:
    """Whether a new run may start on `replica` past the KV rule's margin while nothing there
    waits to be read: its engine reads the margin's worth of contexts again (at its fastest
    time per uncached token, `fastest_read`) in less time than a paused run is away
    (`learned.pause_s`), so what the new run pushes out is read again before it is needed,
    and holding the run would only leave the engine's batch short. True until the pool, the
    reading and the pause are known."""
    pool, pause = replica.kv_tokens, pause_s(view.comebacks)
    if pool is None or read_s_per_token is None or pause is None:
        return True
    return KV_MARGIN_BATCH * pool * read_s_per_token < pause


def _with_resident(d: Draft, replica: Replica, resident: int) -> None:
    batch, interactive = (
        fits(replica, resident, new_run_tokens(d)) if d.rules.kv_rule else (True, True)
    )
    if (resident, batch, interactive) == (
        replica.resident_tokens,
        replica.new_batch_fits,
        replica.new_interactive_fits,
    ):
        return
    update_replica(
        d,
        replica,
        resident_tokens=resident,
        new_batch_fits=batch,
        new_interactive_fits=interactive,
    )


def refresh(d: Draft, replica_id: str) -> None:
    """Recompute a replica's new-run flags (its pool or the new-run size changed)."""
    replica = d.replicas.get(replica_id)
    if replica is not None:
        _with_resident(d, replica, replica.resident_tokens)


def refresh_all(d: Draft) -> None:
    for replica_id in list(d.replicas.keys()):
        refresh(d, replica_id)


def set_footprint(d: Draft, run: Run, tokens: int, until: float = 0.0) -> Run:
    """Make `run` count `tokens` (0: not resident) on its replica until `until` (0: while a
    turn of it is in flight); store it, and return it as stored."""
    replica = d.replicas.get(run.replica) if run.replica else None
    if replica is None:
        tokens = 0
    elif tokens != run.footprint:
        _with_resident(d, replica, replica.resident_tokens - run.footprint + tokens)
    if (tokens, until) != (run.footprint, run.resident_until):
        run = d.change_run(run, footprint=tokens, resident_until=until)
    if tokens and until > 0:
        _schedule(d, run.id, until)
    return run


def _schedule(d: Draft, run_id: str, until: float) -> None:
    step = math.ceil(until / RESIDENCY_STEP_S)
    d.residency_checks = d.residency_checks.set(step, (run_id, d.residency_checks.get(step)))
    cursor = d.residency_cursor
    if cursor == -1 or step < cursor:
        d.residency_cursor = step


def expire(d: Draft, at: float) -> None:
    """End the residency of every idle or paused run not back by `at` (one whose turn is held
    is back: `holds` bounds its wait). Costs nothing while no residency is due, so every event
    may call it; a replica whose working set shrank enough is noted in `d.opened`."""
    cursor = d.residency_cursor
    if cursor == -1 or cursor * RESIDENCY_STEP_S > at:
        return
    last = math.floor(at / RESIDENCY_STEP_S + 1e-9)
    for step in range(cursor, last + 1):
        chain = d.residency_checks.get(step)
        if chain is None:
            continue
        d.residency_checks = d.residency_checks.delete(step)
        while chain is not None:
            rid, chain = chain
            run = d.runs.get(rid)
            if run is None or not run.resident or run.turns_in_flight or run.resident_until > at:
                continue  # gone, left already, generating, or expected later (rescheduled)
            if rid in d.held_by_run:
                _schedule(d, rid, at + 1.0)
                continue
            leave(d, run)
    d.residency_cursor = -1 if not d.residency_checks else max(last + 1, d.residency_cursor)


def leave(d: Draft, run: Run) -> Run:
    """`run` is no longer resident anywhere (it moves, ends, or was given up)."""
    if not run.footprint:
        return run
    return set_footprint(d, run, 0)


def rebuild(d: Draft) -> None:
    """Every replica's resident tokens and new-run flags, the residency index and the count of
    idle resident runs (`State.idle_resident`, which `Draft.change_run` keeps), recomputed from
    the runs."""
    totals: dict[str, int] = {}
    idle = 0
    d.residency_checks = immutables.Map()
    d.residency_cursor = -1
    for run in d.runs.values():
        if run.footprint and run.phase is Phase.IDLE:
            idle += 1
        if run.footprint and run.replica:
            totals[run.replica] = totals.get(run.replica, 0) + run.footprint
            if run.resident_until > 0:
                _schedule(d, run.id, run.resident_until)
    d.idle_resident = idle
    for replica in list(d.replicas.values()):
        _with_resident(d, replica, totals.get(replica.id, 0))


def reread_s(run: Run, replica: Replica) -> float | None:
    """Seconds `replica` would take to read `run`'s context again; None while unknown."""
    slope = replica.prefill.s_per_token
    if slope is None or not run.context_tokens:
        return None
    return slope * max(run.context_tokens - run.shared_tokens, 0)
