"""The seconds budget that looks one turn ahead: a run stops before a turn it would not see
finish.

Pure module: no I/O, no clock (`now` is an argument); reads run states through any mapping whose
values have a `.state` (`budget.HasState`) and what the journal taught (`turn_samples.Ledger`).

A run stops before a turn (`overrun`) when, for the run's own seconds budget or any above it,
the subtree's seconds left are fewer than the next turn's expected seconds
(`turn_estimates.turn_seconds`, the answer's when its tool calls are spent). The trip is a
seconds trip whose `Exceeded.predicted` holds that expectation; nothing is predicted for a model
the runtime has never seen take a turn.
"""

from __future__ import annotations

from collections.abc import Mapping

from luftpause.runtime.core import budget
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.budget import HasState
from luftpause.runtime.core.turn_estimates import turn_seconds
from luftpause.runtime.core.turn_samples import Ledger


def overrun(
    runs: Mapping[str, HasState], handle: str, ledger: Ledger, now: float
) -> tuple[str, m.Exceeded] | None:
    """The budgeted run whose seconds the next turn of `handle` would overrun, and the trip."""
    state = runs[handle].state
    if state.phase is not m.Phase.RUNNING:
        return None
    prior = ledger.stats(state.spec.model)
    predicted = turn_seconds(ledger.history(handle), prior, answer=state.tools_left == 0)
    if predicted is None:
        return None
    for h in budget.ancestors(runs, handle):
        above = runs[h].state
        limit = above.spec.budget_seconds
        if limit is None or above.exceeded is not None:
            continue
        used = budget.used(runs, h, now)["seconds"]
        if limit - used < predicted:
            exceeded = m.Exceeded(
                which="seconds", used=used, limit=limit, predicted=round(predicted, 3)
            )
            return h, exceeded
    return None
