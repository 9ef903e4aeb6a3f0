"""What luftpause's scheduler saw and held during a benchmark window, read from its `/status`.

Shell module used by bench.flood and bench.family: `scheduler_view(url)` samples the
scheduler's `/status` every 0.25 s while its block runs, then fills the yielded dict with, per
replica (by id): its turns in flight, the share of samples it was open to the dataplanes, the
share in which a new batch (interactive) run could start there (the KV rule), the resident
working set against its KV pool, the resident runs, and its turn cap when it had one; and over
the pool, the mean number of held turns by what they waited for (`held_waiting_for`). A router
arm has no scheduler: the dict stays empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator
from typing import Any

import aiohttp


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per replica and over the pool, as the module docstring says."""
    per: dict[str, dict[str, list[float]]] = {}
    held: dict[str, list[float]] = {}
    for st in samples:
        for r in st.get("replicas", []):
            row = per.setdefault(r["id"], {})
            kv = r.get("kv", {})
            pool = kv.get("tokens")
            facts = {
                "in_flight": r["in_flight"],
                "open": 1.0 if r.get("open") else 0.0,
                "new_batch_fits": 1.0 if kv.get("new_batch_fits", True) else 0.0,
                "new_interactive_fits": 1.0 if kv.get("new_interactive_fits", True) else 0.0,
                "resident_runs": kv.get("resident_runs", 0),
            }
            if pool:
                facts["resident_share"] = kv.get("resident_tokens", 0) / pool
            if r.get("capacity") is not None:
                facts["capacity"] = r["capacity"]
            for key, value in facts.items():
                row.setdefault(key, []).append(float(value))
        for reason, n in st.get("held_waiting_for", {}).items():
            held.setdefault(reason, []).append(float(n))
    return {
        "replicas": {
            rid: {f"{key}_mean": _mean(vals) for key, vals in row.items()}
            for rid, row in sorted(per.items())
        },
        "held_waiting_for_mean": {reason: _mean(vals) for reason, vals in held.items()},
        "samples": len(samples),
    }


async def _sample(url: str, period: float, out: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with session.get(url + "/status") as resp:
                    out.append(await resp.json())
            await asyncio.sleep(period)


@contextlib.asynccontextmanager
async def scheduler_view(url: str | None) -> AsyncIterator[dict[str, Any]]:
    """Sample the scheduler at `url` (None: nothing) while the block runs."""
    out: dict[str, Any] = {}
    if url is None:
        yield out
        return
    samples: list[dict[str, Any]] = []
    sampler = asyncio.create_task(_sample(url, 0.25, samples))
    try:
        yield out
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        out.update(summarise(samples))
