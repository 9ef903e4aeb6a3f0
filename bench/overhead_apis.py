"""What the Messages and Responses doors add to a turn: translated to Chat Completions, or
passed to an engine serving the API itself.

Run: `.venv/bin/python -m bench.overhead --apis [--rounds 5] [--requests 256]`.
One simulated engine set to reply instantly (16-token streams), which serves all three APIs, a
scheduler and two dataplanes of it: one whose endpoint file says the engine serves Chat
Completions only (every Messages or Responses turn is translated there and back), one whose file
says it serves all three (every turn passes unchanged). Per API (messages, responses, and chat
for reference), streamed, at 1 and 32 concurrent streams, three arms:

- `direct`: the engine's own endpoint for the API;
- `passed`: the passing dataplane, to the same endpoint;
- `translated`: the translating dataplane, to the engine's `/v1/chat/completions`.

The engine writes its Messages and Responses replies with the dataplane's own translation code
(`luftpause.testkit.engine.doors`), so `direct` and `passed` carry that cost in the engine, and
`translated` carries it in the dataplane instead: the difference between `translated` and
`passed` is what translating in the dataplane costs a turn over passing, and each arm's figure
over `direct` is what the dataplane adds. Arms take turns in an order that rotates round by
round (`common.rotated`), the machine's load recorded per arm and round (`common.LoadWatch`);
each figure is the median over rounds of the per-round value, with min..max. Clients keep their
connections alive and warm each one first. Writes bench/results/overhead_apis.json, with the
Markdown table under "table".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import uvloop

from bench.overhead import INSTANT, _compare, _spread, arm, rounds, save
from luftpause.testkit.stack import SIM_MODEL, Endpoint, LocalStack, write_endpoints

PROMPT = "ping " * 20
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
ARMS = ("direct", "passed", "translated")
# Chat Completions is never translated: both dataplanes pass it, so it has no translated arm.
ARMS_OF = {"chat": ARMS[:2], "messages": ARMS, "responses": ARMS}


def payload(api: str) -> bytes:
    """A streamed 16-token turn of `api`."""
    if api == "messages":
        doc: dict[str, Any] = {"max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]}
    elif api == "responses":
        doc = {"max_output_tokens": 16, "input": PROMPT, "store": False}
    else:
        doc = {"max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]}
    return json.dumps({"model": SIM_MODEL, "stream": True, **doc}).encode()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-apis-"))
        local = await LocalStack(workdir, engine_args=INSTANT, engines=1).start(stack)
        await local.wait_healthy()
        engine = local.engine_url(0)
        scheduler = local.procs["scheduler"].pid
        translating = local.base_url.removesuffix("/v1")
        config = write_endpoints(
            workdir / "endpoints-native.yaml",
            [Endpoint(id="engine-0", url=engine, options={"apis": list(PATHS)})],
        )
        passing = await local.launcher.dataplane(
            local.scheduler, name="dataplane-native", config=config, ready="/ready"
        )
        pids = {
            "direct": [],
            "passed": [local.procs["dataplane-native"].pid, scheduler],
            "translated": [local.procs["dataplane"].pid, scheduler],
        }
        out: dict[str, Any] = {}
        for api, path in PATHS.items():
            urls = {
                "direct": engine + path,
                "passed": passing.url + path,
                "translated": translating + path,
            }
            arms = ARMS_OF[api]
            for concurrency in args.concurrency:

                async def measure(
                    name: str, c: int = concurrency, api: str = api, urls: dict[str, str] = urls
                ) -> dict[str, Any]:
                    return await arm(urls[name], c, args.requests, True, pids[name], payload(api))

                per_arm = await rounds(arms, args.rounds, measure)
                label = f"{api}_c{concurrency}"
                out[label] = _compare(per_arm)
                if "translated" in per_arm:
                    # Paired by round: what translating costs a turn over passing it.
                    out[label]["translated_over_passed_ms"] = {
                        f"ttfb_{q}": _spread(
                            [
                                t["ttfb"][q] - p["ttfb"][q]
                                for t, p in zip(
                                    per_arm["translated"], per_arm["passed"], strict=True
                                )
                            ]
                        )
                        for q in ("p50", "p99")
                    }
                print(label, json.dumps(out[label]["added_ms"]), flush=True)
        return out


def _cell(value: dict[str, float] | None) -> str:
    if value is None:
        return "-"
    return f"{value['median']:.2f} ({value['min']:.2f}..{value['max']:.2f})"


def table(results: dict[str, Any], concurrency: list[int]) -> str:
    """Markdown: time to first byte per API and arm, and what each dataplane arm adds."""
    lines = [
        "Streamed turns, time to first byte p50 in ms, median over rounds (min..max); added:"
        " over `direct`",
        "",
        "| API | arm | "
        + " | ".join(f"TTFB @{c} | added @{c} | CPU ms/turn @{c}" for c in concurrency)
        + " |",
        "|---|---|" + "---|---|---|" * len(concurrency),
    ]
    for api in PATHS:
        for name in ARMS_OF[api]:
            cells = []
            for c in concurrency:
                phase = results.get(f"{api}_c{c}", {})
                result = phase.get("arms", {}).get(name, {})
                cells.append(_cell(result.get("ttfb_p50_ms")))
                cells.append(_cell(phase.get("added_ms", {}).get(f"{name}_ttfb_p50")))
                cells.append(_cell(result.get("cpu_ms_per_turn")))
            lines.append(f"| {api} | {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "What translating adds over passing, time to first byte in ms (paired by round)",
        "",
        "| API | " + " | ".join(f"p50 @{c} | p99 @{c}" for c in concurrency) + " |",
        "|---|" + "---|---|" * len(concurrency),
    ]
    for api in ("messages", "responses"):
        cells = []
        for c in concurrency:
            over = results.get(f"{api}_c{c}", {}).get("translated_over_passed_ms", {})
            cells += [_cell(over.get("ttfb_p50")), _cell(over.get("ttfb_p99"))]
        lines.append(f"| {api} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=256, help="timed requests per arm per round")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--out", default="overhead_apis", help="result name under bench/results/")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    result = uvloop.run(run(args))
    save("overhead --apis", args, result, table(result, args.concurrency))


if __name__ == "__main__":
    main()
