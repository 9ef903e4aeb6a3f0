"""The Markdown tables of `bench.overhead`'s results: added latency, requests/s, CPU per turn.

Pure: from the result dict `bench.overhead` writes (its "results"), to text.
"""

from __future__ import annotations

from typing import Any


def _cell(value: dict[str, float] | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value['median']:.{digits}f} ({value['min']:.{digits}f}..{value['max']:.{digits}f})"


def table(results: dict[str, Any]) -> str:
    """Markdown: added latency at 1 and 32 streams, requests/s at 32, CPU per turn."""
    arms = list(results["c1_stream"]["arms"]) if "c1_stream" in results else []
    lines = [
        "Added latency over direct, streaming, ms: median over rounds (min..max)",
        "",
        "| arm | TTFB p50 @1 | TTFB p99 @1 | total p50 @1 | total p99 @1"
        " | TTFB p50 @32 | TTFB p99 @32 | total p50 @32 | total p99 @32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in arms:
        if name == "direct":
            continue
        cells = [
            _cell(results.get(f"c{c}_stream", {}).get("added_ms", {}).get(f"{name}_{stat}"))
            for c in (1, 32)
            for stat in ("ttfb_p50", "ttfb_p99", "total_p50", "total_p99")
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Requests/s at 32 clients, and CPU ms per turn (utime+stime from /proc;"
        " dataplane = dataplane + scheduler)",
        "",
        "| arm | req/s @32 stream | req/s @32 non-stream | CPU/turn non-stream @1"
        " | CPU/turn stream @1 | CPU/turn non-stream @32 | CPU/turn stream @32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in arms:
        rps = [
            _cell(results.get(f"c32_{kind}", {}).get("arms", {}).get(name, {}).get("rps"), 0)
            for kind in ("stream", "nonstream")
        ]
        cpu = [
            _cell(
                results.get(f"c{c}_{kind}", {}).get("arms", {}).get(name, {}).get("cpu_ms_per_turn")
            )
            for c in (1, 32)
            for kind in ("nonstream", "stream")
        ]
        lines.append(f"| {name} | " + " | ".join(rps + cpu) + " |")
    return "\n".join(lines + _split_table(results, arms))


def _split_table(results: dict[str, Any], arms: list[str]) -> list[str]:
    """The dataplane arms' CPU per turn, process by process: the dataplane, then the scheduler."""
    lines = [
        "",
        "CPU ms per turn by process, dataplane / scheduler (median over rounds)",
        "",
        "| arm | non-stream @1 | stream @1 | non-stream @32 | stream @32 |",
        "|---|---|---|---|---|",
    ]
    rows = 0
    for name in arms:
        cells = []
        for c in (1, 32):
            for kind in ("nonstream", "stream"):
                arm_result = results.get(f"c{c}_{kind}", {}).get("arms", {}).get(name, {})
                each = arm_result.get("cpu_ms_per_turn_each")
                cells.append(" / ".join(f"{v['median']:.2f}" for v in each) if each else "-")
        if any(cell != "-" for cell in cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
            rows += 1
    return lines if rows else []
