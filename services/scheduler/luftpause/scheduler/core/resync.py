"""Resync: a dataplane's report replaces what the scheduler believed about its runs and turns.

Pure module. The dataplane's turns in flight replace the ones the scheduler had for it, the
runs it reports replace the scheduler's records of them, and then every index is rebuilt from
the facts by the module that owns it (`counters`, `expiry`, `residency`, `placement`,
`queues`), so the state after a Resync is exactly what the dataplanes reported. The save files
the dataplane wrote fill those of the replicas' files this scheduler knows nothing of
(`slots.relearn`). O(runs +
turns): it happens once per (re)connect.
"""

from __future__ import annotations

import immutables

from luftpause.scheduler.core import counters, expiry, placement, queues, residency, slots
from luftpause.scheduler.core.events import Resync
from luftpause.scheduler.core.model import DataplaneLink, Phase, Run, Turn, evolve
from luftpause.scheduler.core.state import Draft


def resync(d: Draft, ev: Resync) -> None:
    turns = {tid: t for tid, t in d.turns.items() if t.dataplane != ev.dataplane}
    for snap in ev.turns:
        if snap.replica in d.replicas:
            known = d.turns.get(snap.turn_id)
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
    per_run: dict[str, int] = {}
    for t in turns.values():
        if not t.single_pass:
            per_run[t.run_id] = per_run.get(t.run_id, 0) + 1
    runs = dict(d.runs.items())
    for rs in ev.runs:
        replica = rs.replica if rs.replica in d.replicas else ""
        was = d.runs.get(rs.run_id)
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
    for rid, run in runs.items():
        # A run generates exactly while a turn of it is in flight.
        n = per_run.get(rid, 0)
        phase = (
            Phase.GENERATING if n else (Phase.IDLE if run.phase is Phase.GENERATING else run.phase)
        )
        if run.footprint and not n and run.resident_until <= 0:
            # Its turns were lost: nothing says when it is back, so it is not resident.
            runs[rid] = evolve(run, phase=phase, footprint=0)
        elif phase is not run.phase:
            runs[rid] = evolve(run, phase=phase)
    link = d.dataplanes.get(ev.dataplane, DataplaneLink())
    d.dataplanes = d.dataplanes.set(
        ev.dataplane, DataplaneLink(streams=link.streams, gone_since=None)
    )
    for rid, rep in d.replicas.items():
        if rep.saves and ev.saved:
            files = slots.relearn(rep, ev.saved)
            if files != rep.saves:  # the files only: no index reads them
                d.replicas = d.replicas.set(rid, evolve(rep, saves=files))
    d.turns = immutables.Map(turns)
    d.runs = immutables.Map(runs)
    d.held = immutables.Map({tid: h for tid, h in d.held.items() if tid not in turns})
    rebuild(d, ev.at)


def rebuild(d: Draft, at: float) -> None:
    """Every index, from the facts alone, each by its owner (in the order they depend on each
    other: counters first, since room and residency read the replicas' counts)."""
    counters.rebuild(d)
    expiry.rebuild(d, at)
    residency.rebuild(d)
    placement.rebuild(d)
    queues.rebuild(d)  # and `shares`' counts, which count the held turns too
