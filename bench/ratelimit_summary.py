"""The rate-limit benchmark's figures: one arm's measurement, spreads over seeds, the table.

Pure module: turns and provider tallies in, numbers and Markdown out; no I/O, no clock reads.

Per arm and seed (`measure`): turns finished; 429s at the providers (their own tally, so
whatever the arm sent counts, probes included) and 429s the agents' clients saw; tokens billed
and refused by the providers; goodput (prompt and completion tokens of the completed turns per
real second of the run); the p50 and p90 of turn latency and the p90 of time to first byte, as
the agent saw them (retries and waits included); wall clock from the first agent's start to the
last one's end; the ideal schedule (`ratelimit_plan.ideal_seconds` of the completed turns'
tokens and requests), wall over ideal, the earliest the budgets allow (`earliest_seconds`) and
wall over that; client-visible errors (a call that failed after the client's own retries) and
turns never completed; and per provider its tally and the share of completed turns it served.
An arm that failed (`{"failed": ...}`) counts in `failed_runs`, not in the figures.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.ratelimit_plan import (
    ARM_ABOUT,
    ARMS,
    LITELLM_ROUTER,
    Charged,
    Provider,
    Scenario,
    earliest_seconds,
    ideal_seconds,
)

# The figures a row shows, their labels and how many decimals.
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("turns_done", "turns finished", 0),
    ("provider_429s", "429s at provider", 0),
    ("client_429s", "429s seen by clients", 0),
    ("errors", "client-visible errors", 0),
    ("turn_p50_s", "turn p50 (s)", 2),
    ("turn_p90_s", "turn p90 (s)", 2),
    ("ttfb_p90_s", "TTFB p90 (s)", 2),
    ("goodput_tps", "goodput (tok/s)", 0),
    ("wall_s", "wall (s)", 1),
    ("earliest_s", "earliest (s)", 1),
    ("wall_over_earliest", "wall / earliest", 2),
)
SECTION = "## Hosted APIs under rate limits (`python -m bench.ratelimit`)"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFacts:
    """What the summary needs of one turn (`ratelimit_agents.Turn` has these fields)."""

    ok: bool
    latency_s: float
    ttfb_s: float | None
    prompt_tokens: int
    completion_tokens: int
    provider: str
    refused_seen: int
    errors: int
    error_kinds: tuple[str, ...] = ()  # `status 429`, `APITimeoutError`, ... one per error


def rank(values: Sequence[float], q: float) -> float | None:
    """The `q` quantile by rank (0.5: the median's upper middle); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def measure(
    turns: Sequence[TurnFacts],
    tallies: Mapping[str, Mapping[str, int]],
    *,
    wall_s: float,
    providers: Sequence[Provider],
    window_real_s: float,
    regime: str,
    phase_s: float = 0.0,
) -> dict[str, Any]:
    """One arm's figures for one seed; `tallies` is each provider's tally by its id; `phase_s`:
    how far into a fixed window the run started."""
    done = [t for t in turns if t.ok]
    charged = Charged(
        requests=len(done),
        input_tokens=sum(t.prompt_tokens for t in done),
        output_tokens=sum(t.completion_tokens for t in done),
    )
    ideal = ideal_seconds(charged, providers, window_real_s)
    earliest = earliest_seconds(charged, providers, window_real_s, regime, phase_s)
    served = Counter(t.provider for t in done)
    ttfb = [t.ttfb_s for t in done if t.ttfb_s is not None]
    latency = [t.latency_s for t in done]
    return {
        "turns_done": len(done),
        "provider_429s": sum(t["refused"] for t in tallies.values()),
        "client_429s": sum(t.refused_seen for t in turns),
        "billed_tokens": sum(t["billed_tokens"] for t in tallies.values()),
        "refused_tokens": sum(t["refused_tokens"] for t in tallies.values()),
        "goodput_tps": charged.tokens / wall_s if wall_s > 0 else 0.0,
        "turn_p50_s": rank(latency, 0.5),
        "turn_p90_s": rank(latency, 0.9),
        "turn_p95_s": rank(latency, 0.95),
        "ttfb_p90_s": rank(ttfb, 0.9),
        "wall_s": wall_s,
        "ideal_s": ideal,
        "earliest_s": earliest,
        "wall_over_ideal": wall_s / ideal if ideal > 0 else None,
        "wall_over_earliest": wall_s / earliest if earliest > 0 else None,
        "errors": sum(t.errors for t in turns),
        "error_kinds": dict(Counter(k for t in turns for k in t.error_kinds)),
        "turns": len(turns),
        "turns_failed": len(turns) - len(done),
        "workload_tokens": charged.tokens,
        "per_provider": {
            pid: {
                **tally,
                "turn_share": served.get(pid, 0) / len(done) if done else 0.0,
            }
            for pid, tally in tallies.items()
        },
    }


def spread(values: Iterable[float | None]) -> dict[str, float] | None:
    """Median, min and max of the values that exist; None when none does."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return {"median": statistics.median(known), "min": min(known), "max": max(known)}


def summarise(seeds: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per arm, each figure's spread over the seeds (a seed maps arm -> `measure` result)."""
    arms = [a for a in ARMS if any(a in s for s in seeds)]
    out: dict[str, dict[str, Any]] = {}
    for arm in arms:
        runs = [s[arm] for s in seeds if arm in s and "failed" not in s[arm]]
        figures: dict[str, Any] = {key: spread(r.get(key) for r in runs) for key, _, _ in COLUMNS}
        figures["turns_failed"] = spread(r["turns_failed"] for r in runs)
        figures["seeds"] = len(runs)
        figures["failed_runs"] = sum(1 for s in seeds if "failed" in s.get(arm, {}))
        figures["cpu_busy_share"] = spread(r.get("load", {}).get("cpu_busy_share") for r in runs)
        pids = sorted({pid for r in runs for pid in r["per_provider"]})
        figures["per_provider"] = {
            pid: {
                k: spread(r["per_provider"].get(pid, {}).get(k) for r in runs)
                for k in ("refused", "served", "turn_share")
            }
            for pid in pids
        }
        out[arm] = figures
    return out


def cell(value: Mapping[str, float] | None, digits: int) -> str:
    """`median (min..max)`, or the one value when they agree; `-` for none."""
    if value is None:
        return "-"

    def f(x: float) -> str:
        return f"{x:,.{digits}f}"

    low, mid, high = f(value["min"]), f(value["median"]), f(value["max"])
    return mid if low == high else f"{mid} ({low}..{high})"


def table(scenarios: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per scenario and arm; a scenario with several providers adds their 429s and
    their shares of the turns."""
    head = ["scenario", "arm", *(label for _, label, _ in COLUMNS), "per provider: 429s, turns"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, data in scenarios.items():
        for arm, figures in data.get("summary", {}).items():
            cells = [cell(figures.get(key), digits) for key, _, digits in COLUMNS]
            per = figures.get("per_provider", {})
            split = (
                "; ".join(
                    f"{pid} {cell(v['refused'], 0)}, {_share(v['turn_share'])}"
                    for pid, v in per.items()
                )
                if len(per) > 1
                else ""
            )
            rows.append("| " + " | ".join([name, arm, *cells, split]) + " |")
    return "\n".join(rows)


def _share(value: Mapping[str, float] | None) -> str:
    return "-" if value is None else f"{value['median']:.0%}"


def describe(scenario: Scenario) -> str:
    """One line: what the scenario is, its limits, its workload and its time scale."""
    limits = ", ".join(
        f"{p.id} " + " ".join(f"{b} {v:,}" for b, v in p.limits().items())
        for p in scenario.providers
    )
    timing = (
        f"time scale {scenario.time_scale:g} (stress: windows of {scenario.window_real_s:g} real s)"
        if scenario.stress
        else "real time"
    )
    return (
        f"`{scenario.name}`: {scenario.about}. Limits per window of {scenario.window_s:g} "
        f"simulated s ({scenario.window_real_s:g} real s): {limits}; output charged by "
        f"{scenario.charge}; {scenario.agents} agents; {timing}."
    )


def section(result: Mapping[str, Any], stress: Mapping[str, Any] | None = None) -> str:
    """RESULTS.md's section for a real-time result (`ratelimit_realtime.json`), and the
    time-scaled stress table after it when `stress` (`ratelimit_stress.json`) is given."""
    machine = result.get("machine", {})
    lines = [
        SECTION,
        "",
        "Agents with tool calls against the simulator's hosted mode in real time (a window is "
        "a real minute); every arm of a seed does the same work against fresh providers with "
        "the same limits, the arms' order rotated per seed and each arm starting at the same "
        "point of a fixed window. Cells: median (min..max) over seeds. 429s at provider are "
        "the providers' own counts (probes included); client-visible errors are calls that "
        "failed after the client's own retries (the agent sent them again); turn latency and "
        "TTFB are as the agents saw them, retries and waits included. Earliest: what the "
        "budgets allow for the finished turns' tokens, since they start whole. "
        f"{_side_by_side(result)}{_measured(machine)}",
        "",
        "Arms:",
        "",
        *(f"- `{arm}`: {about}." for arm, about in ARM_ABOUT.items()),
        "",
        "LiteLLM's `router_settings`: "
        + ", ".join(f"`{k}: {v}`" for k, v in result.get("litellm_router", LITELLM_ROUTER).items())
        + "; each deployment's `rpm` and `tpm` are its provider's limits per minute.",
        "",
        *_table_block(result),
    ]
    if stress:
        lines += [
            "Stress (time-scaled, not a comparison with LiteLLM, whose limits count per real "
            "minute and cannot bind in 10-second windows), measured "
            f"{stress.get('machine', {}).get('when', '?')}:",
            "",
            *_table_block(stress),
        ]
    return "\n".join(lines)


def _measured(machine: Mapping[str, Any]) -> str:
    commit = str(machine.get("commit", "?"))[:10]
    dirty = " (with uncommitted changes)" if machine.get("dirty") else ""
    return f"Measured {machine.get('when', '?')} on commit {commit}{dirty}."


def _side_by_side(result: Mapping[str, Any]) -> str:
    if not result.get("concurrent_scenarios"):
        return ""
    return (
        "The scenarios ran side by side (each its arms one at a time, in an order that differs "
        "between scenarios), the machine mostly waiting on the providers' windows; each arm's "
        "CPU share is in the JSON (`load`). "
    )


def _table_block(result: Mapping[str, Any]) -> list[str]:
    scenarios = result["scenarios"]
    return [
        *(f"- {s['description']} Seeds {_seeds(s)}." for s in scenarios.values()),
        "",
        table(scenarios),
        "",
    ]


def _seeds(entry: Mapping[str, Any]) -> str:
    return ", ".join(str(s["seed"]) for s in entry["seeds"]) or "none"


def put_section(document: str, text: str) -> str:
    """`document` with its rate-limit section replaced by `text` (appended if it has none)."""
    start = document.find(SECTION)
    if start < 0:
        return document.rstrip("\n") + "\n\n" + text
    end = document.find("\n## ", start + len(SECTION))
    rest = "" if end < 0 else document[end + 1 :]
    return document[:start] + text + ("\n" + rest if rest else "")
