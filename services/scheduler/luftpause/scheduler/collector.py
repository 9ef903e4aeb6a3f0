"""The scheduler process's garbage collector, set for a state of many small acyclic records.

Shell module (a process-wide setting, made once at start). The decision core keeps its state in
frozen records and persistent maps that hold no reference cycles, so reference counting frees
what a step replaces. CPython's cycle collector still walks every container allocated since its
last pass: with its default threshold (a young pass every 700 allocations net) a saturated pool
at 10,000 live runs spent more in the collector than in any step of a freed slot (py-spy on
`bench.scheduler_core`, docs/measurements.md, "round three"). `tune` lets 100,000 allocations go
by between young passes and makes the older generations' passes rarer still, and freezes what
startup built (modules, configuration) out of the collector's reach. Cycles elsewhere in the
process (asyncio, gRPC) are still collected, later.
"""

from __future__ import annotations

import gc

# Allocations net between young passes; young passes per middle one; middle per full one.
THRESHOLDS = (100_000, 50, 1_000)


def tune() -> None:
    """Set the collector for the scheduler: call once, after startup has built what lasts."""
    gc.set_threshold(*THRESHOLDS)
    gc.freeze()
