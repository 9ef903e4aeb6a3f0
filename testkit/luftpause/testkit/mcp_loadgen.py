"""Closed-loop sub-agent load through the MCP runtime: `loadgen`'s workload, driven by spawn and
await instead of an own model loop.

Two layers. The pure part (`McpRun`, `record`, `summarise`) turns what the
runtime said about each run into loadgen's per-class summary: no I/O, no clock. The shell
(`run_mcp_workload`) holds `callers` MCP sessions (the official `mcp` client; the runtime's
caller of a run is its session) and spreads the agents over them. An agent spawns a run (its
class, tools, a task padded to `context_chars`, at most `tool_calls` tool calls), awaits its
handle, records it, and spawns the next at once, until the window ends or it has done
`runs_per_agent` runs. After the window one GET /status reads each run's prompt tokens and
those the engine served from its prefix cache.

What the runtime does not expose, the summary leaves as None: time to first token (its turns do
not stream) and moved runs (it does not see which replica served a turn).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, replace
from typing import Any

import aiohttp
from mcp import Client
from mcp.types import Implementation

from luftpause.testkit.preambles import pad
from luftpause.testkit.stats import jain, percentile

CLASSES = ("interactive", "batch")
AWAIT_MAX = 600.0  # the runtime's cap on one await
ERROR_PAUSE = 0.5  # after a failed spawn or await, before the agent's next run


@dataclass(frozen=True, slots=True, kw_only=True)
class McpWorkload:
    url: str  # the runtime's MCP endpoint, ending in /mcp
    interactive: int
    batch: int
    context_chars: int
    tool_calls: int
    window_s: float
    seed: int
    callers: int = 4
    tools: tuple[str, ...] = ("lookup",)
    model: str | None = None  # None: the runtime's default model
    max_tokens: int = 64  # per turn, as loadgen asks
    runs_per_agent: int | None = None  # None: as many as fit in the window

    def __post_init__(self) -> None:
        if min(self.interactive, self.batch, self.context_chars, self.tool_calls) < 0:
            raise ValueError("agent counts, context_chars and tool_calls must be at least 0")
        if self.callers < 1 or self.window_s <= 0:
            raise ValueError("callers must be at least 1 and window_s positive")

    @property
    def status_url(self) -> str:
        return self.url.removesuffix("/mcp") + "/status"


@dataclass(frozen=True, slots=True, kw_only=True)
class McpRun:
    """One run as the load saw it; times in seconds from the window's start."""

    handle: str | None  # None when spawn itself failed
    service_class: str
    caller: str
    started: float
    ended: float
    state: str  # the runtime's phase ("finished", "failed", ...) or "error" (the call failed)
    turns: int = 0
    tool_calls: int = 0
    failed_tool_calls: int = 0
    error: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.service_class not in CLASSES:
            raise ValueError(f"service_class must be one of {CLASSES}")
        if self.ended < self.started:
            raise ValueError("a run cannot end before it starts")

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    @property
    def failed(self) -> bool:
        """The run or the call about it went wrong (a run still going at the end is not)."""
        return self.state in ("failed", "cancelled", "error") or self.error is not None


def record(
    summary: Mapping[str, Any] | None,
    *,
    service_class: str,
    caller: str,
    started: float,
    ended: float,
    handle: str | None = None,
    error: str | None = None,
) -> McpRun:
    """An `McpRun` from one entry of await's (or status's) `runs`, or from a failed call."""
    s = summary or {}
    return McpRun(
        handle=s.get("handle", handle),
        service_class=service_class,
        caller=caller,
        started=started,
        ended=ended,
        state=str(s.get("state", "error")),
        turns=int(s.get("turns", 0)),
        tool_calls=int(s.get("toolCalls", 0)),
        failed_tool_calls=int(s.get("failedToolCalls", 0)),
        error=error if error is not None else s.get("error"),
    )


def prompt_tokens(status: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Each run's own prompt tokens and cached prompt tokens from the runtime's GET /status."""
    out: dict[str, tuple[int, int]] = {}
    stack = list(status.get("tree", ()))
    while stack:
        node = stack.pop()
        own = node["own"]
        out[node["handle"]] = (int(own["promptTokens"]), int(own.get("cachedPromptTokens", 0)))
        stack.extend(node.get("children", ()))
    return out


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def summarise(runs: Sequence[McpRun], span_s: float) -> dict[str, Any]:
    """Per class, loadgen's summary keys over runs finished inside `span_s`, and a few more."""
    out: dict[str, Any] = {}
    for cls in CLASSES:
        mine = [r for r in runs if r.service_class == cls]
        done = [r for r in mine if r.finished and r.ended <= span_s]
        per_caller = dict.fromkeys(sorted({r.caller for r in mine}), 0)
        for r in done:
            per_caller[r.caller] += 1
        tokens = [r.prompt_tokens for r in done if r.prompt_tokens is not None]
        cached = sum(r.cached_tokens or 0 for r in done if r.prompt_tokens is not None)
        out[cls] = {
            "runs_per_min": round(len(done) / (span_s / 60), 2),
            "run_time_p50_s": percentile([r.ended - r.started for r in done], 0.5),
            "run_time_p99_s": percentile([r.ended - r.started for r in done], 0.99),
            "ttft_p50_s": None,
            "ttft_p99_s": None,
            "cached_share": round(cached / sum(tokens), 4) if sum(tokens) else None,
            "prompt_tokens": sum(tokens),
            "cached_tokens": cached,
            "errors": sum(1 for r in mine if r.failed),
            "jain_callers": jain([float(v) for v in per_caller.values()]),
            "runs_moved": None,
            "runs_finished": len(done),
            "runs_unfinished": sum(1 for r in mine if not r.finished and not r.failed),
            "turns_per_run": _mean([r.turns for r in done]),
            "tool_calls_per_run": _mean([r.tool_calls for r in done]),
            "failed_tool_calls": sum(r.failed_tool_calls for r in mine),
            "prompt_tokens_per_run": _mean(tokens),
        }
    return out


# --- shell ---


async def _call(client: Client, tool: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
    result = await client.call_tool(tool, args, read_timeout_seconds=timeout)
    if result.is_error or result.structured_content is None:
        text = " ".join(getattr(c, "text", "") for c in result.content)
        raise RuntimeError(f"{tool}: {text[:300]}")
    return result.structured_content


async def _one_run(
    client: Client, caller: str, cls: str, wl: McpWorkload, rng: random.Random, t0: float
) -> McpRun:
    deadline = t0 + wl.window_s
    started = time.monotonic()
    spawn_args: dict[str, Any] = {
        "task": pad(rng, wl.context_chars),
        "serviceClass": cls,
        "tools": list(wl.tools),
        "maxToolCalls": wl.tool_calls,
        "maxTokens": wl.max_tokens,
    }
    if wl.model is not None:
        spawn_args["model"] = wl.model
    handle: str | None = None
    summary: dict[str, Any] | None = None
    error: str | None = None
    try:
        handle = (await _call(client, "spawn", spawn_args, 60.0))["handle"]
        wait = min(max(deadline - time.monotonic(), 0.0), AWAIT_MAX)
        out = await _call(client, "await", {"handles": [handle], "timeout": wait}, wait + 60.0)
        summary = out["runs"][0]
    except Exception as exc:  # any failed call is one errored run of the load
        error = f"{type(exc).__name__}: {exc}"
    run = record(
        summary,
        service_class=cls,
        caller=caller,
        started=started - t0,
        ended=time.monotonic() - t0,
        handle=handle,
        error=error,
    )
    if error is not None:
        await asyncio.sleep(ERROR_PAUSE)
    return run


async def _agent(
    client: Client, caller: str, cls: str, index: int, wl: McpWorkload, t0: float
) -> list[McpRun]:
    rng = random.Random(f"{wl.seed}:{cls}:{index}")
    runs: list[McpRun] = []
    while time.monotonic() < t0 + wl.window_s and (
        wl.runs_per_agent is None or len(runs) < wl.runs_per_agent
    ):
        runs.append(await _one_run(client, caller, cls, wl, rng, t0))
    return runs


async def _status(url: str) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as resp:
        resp.raise_for_status()
        doc: dict[str, Any] = await resp.json()
        return doc


class RuntimeUnreachable(Exception):
    """The runtime's /status did not answer before the load started."""


async def run_mcp_workload(wl: McpWorkload) -> dict[str, Any]:
    """Run the closed loop for the window; return the workload, per-class summary and runs.

    Raises `RuntimeUnreachable` when the runtime does not answer at all.
    """
    try:
        await _status(wl.status_url)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise RuntimeUnreachable(f"no runtime answers at {wl.status_url}: {exc}") from exc
    callers = [f"caller-{i}" for i in range(wl.callers)]
    clients = [
        Client(wl.url, client_info=Implementation(name=f"mcp-loadgen-{c}", version="1"))
        for c in callers
    ]
    async with AsyncExitStack() as exits:
        for c in clients:
            await exits.enter_async_context(c)
        t0 = time.monotonic()
        agents = [
            (callers[i % wl.callers], cls, i)
            for cls, n in (("interactive", wl.interactive), ("batch", wl.batch))
            for i in range(n)
        ]
        done = await asyncio.gather(
            *(_agent(clients[callers.index(c)], c, cls, i, wl, t0) for c, cls, i in agents)
        )
        span = min(time.monotonic() - t0, wl.window_s)
    tokens = prompt_tokens(await _status(wl.status_url))
    runs = [
        replace(r, prompt_tokens=tokens[r.handle][0], cached_tokens=tokens[r.handle][1])
        if r.handle in tokens
        else r
        for agent_runs in done
        for r in agent_runs
    ]
    return {
        "workload": asdict(wl),
        "span_s": round(span, 3),
        "summary": summarise(runs, span),
        "runs": [asdict(r) for r in runs],
    }
