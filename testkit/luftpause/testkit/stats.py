"""Summary statistics the load generators share. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q` quantile by rank, rounded to ms; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)], 3)


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index: 1 when all equal, 1/n when one gets everything."""
    if not values or not any(values):
        return None
    return round(sum(values) ** 2 / (len(values) * sum(v * v for v in values)), 4)
