"""What each engine did during a benchmark window, read from its `/metrics`.

Shell module used by bench.flood, bench.flood_mcp and bench.family: `engine_load(engines)`
samples every engine's `/metrics` every 0.25 s while its block runs and then fills the yielded
dict with the summary:

- over the pool: mean requests running and waiting (summed over engines), and for simulators
  the mean and worst lag behind their schedule (real seconds);
- per engine (`per_engine`, in the order given): mean running and waiting requests, the share
  of samples with a queue, the mean share of its KV pool its running requests held (when it
  says), and the share of prompt tokens it served from its prefix cache over the window (from
  the simulator's counters, vLLM's prefix-cache counters or llama.cpp's prompt-token counters,
  whichever it has).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from luftpause.scheduler.engine_load import parse_load

_LAG = "luftpause_sim_lag_seconds"
# (prompt tokens, prompt tokens from cache, whether the first counts the cached ones too)
# counters; the first pair an engine has wins. llama.cpp's prompt counter is of the tokens it
# computed, "excluding cached tokens" (its /metrics HELP line): its prompt is the sum of both.
_PROMPT_COUNTERS = (
    ("luftpause_sim_prompt_tokens_total", "luftpause_sim_cached_tokens_total", True),
    ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", True),
    ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total", False),
)


def _values(text: str) -> dict[str, float]:
    """Every unlabelled-or-labelled sample's value by metric name (summed over label sets)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        with contextlib.suppress(ValueError, IndexError):
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[-1])
    return out


def sim_lag(text: str) -> float | None:
    """How late a simulator's last engine step started (real seconds), from its /metrics."""
    return _values(text).get(_LAG)


@dataclass
class _Series:
    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    kv_share: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    first: tuple[float, float] | None = None
    last: tuple[float, float] | None = None

    def add(self, text: str) -> None:
        values = _values(text)
        load = parse_load(text)
        if load is not None:
            self.running.append(load.running)
            self.waiting.append(load.waiting)
            if load.kv_total and load.kv_used is not None:
                self.kv_share.append(load.kv_used / load.kv_total)
        if _LAG in values:
            self.lag.append(values[_LAG])
        for prompt, cached, whole in _PROMPT_COUNTERS:
            if prompt in values and cached in values:
                read = values[prompt] + (0.0 if whole else values[cached])
                pair = (read, values[cached])
                self.first = self.first or pair
                self.last = pair
                break

    def summary(self) -> dict[str, float | None]:
        def mean(vals: list[float]) -> float | None:
            return round(statistics.fmean(vals), 3) if vals else None

        hit = None
        if self.first is not None and self.last is not None:
            prompts = self.last[0] - self.first[0]
            hit = round((self.last[1] - self.first[1]) / prompts, 4) if prompts > 0 else None
        return {
            "running_mean": mean(self.running),
            "waiting_mean": mean(self.waiting),
            "queued_share": mean([1.0 if w > 0 else 0.0 for w in self.waiting]),
            "kv_used_share_mean": mean(self.kv_share),
            "cache_hit_share": hit,
        }


async def _sample(engines: list[str], period: float, series: list[_Series]) -> None:
    async with aiohttp.ClientSession() as session:
        while True:
            for url, s in zip(engines, series, strict=True):
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url + "/metrics") as resp:
                        s.add(await resp.text())
            await asyncio.sleep(period)


def summarise(series: list[_Series]) -> dict[str, Any]:
    """The pool's means (as bench.flood always reported them) and each engine's own."""
    n = min((len(s.running) for s in series), default=0)
    running = [sum(s.running[i] for s in series) for i in range(n)]
    waiting = [sum(s.waiting[i] for s in series) for i in range(n)]
    out: dict[str, Any] = {
        "engine_running_mean": round(statistics.fmean(running), 2) if running else None,
        "engine_waiting_mean": round(statistics.fmean(waiting), 2) if waiting else None,
    }
    lags = [max(v) for v in zip(*(s.lag for s in series if s.lag), strict=False)]
    if lags:
        out["sim_lag_mean_s"] = round(statistics.fmean(lags), 4)
        out["sim_lag_max_s"] = round(max(lags), 4)
    out["per_engine"] = [s.summary() for s in series]
    return out


@contextlib.asynccontextmanager
async def engine_load(engines: list[str]) -> AsyncIterator[dict[str, Any]]:
    """Sample the engines' load while the block runs; the summary lands in the yielded dict."""
    series = [_Series() for _ in engines]
    out: dict[str, Any] = {}
    sampler = asyncio.create_task(_sample(engines, 0.25, series))
    try:
        yield out
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        out.update(summarise(series))
