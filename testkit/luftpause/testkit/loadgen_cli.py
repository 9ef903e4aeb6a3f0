"""`luftpause loadgen`'s command line: options (each also from its `LUFTPAUSE_*` variable) in,
a workload run and its JSON out.

Shell module over `loadgen` (own-loop agents) and `mcp_loadgen` (sub-agents through a runtime).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from luftpause.common import envargs
from luftpause.testkit import loadgen
from luftpause.testkit.loadgen import TOOL_STYLES, Workload, run_workload
from luftpause.testkit.preambles import PREAMBLES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="luftpause loadgen", description=loadgen.__doc__)
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    p.add_argument(
        "--mcp-url",
        help="drive sub-agents through this runtime's spawn/await instead (…/mcp); the "
        "options for a base model, the tool style and the shared prefix do not apply",
    )
    p.add_argument("--model", default="luftpause-sim")
    p.add_argument("--interactive", type=int, default=4, help="interactive agents")
    p.add_argument("--batch", type=int, default=16, help="batch agents")
    p.add_argument("--context-chars", type=int, default=8000)
    p.add_argument("--tool-calls", type=int, default=3, help="tool calls per run (at most)")
    p.add_argument("--tool-seconds", type=float, default=1.0)
    p.add_argument("--window-s", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--callers", type=int, default=4, help="distinct x-luftpause-caller values")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every turn")
    p.add_argument(
        "--preamble",
        choices=sorted(PREAMBLES),
        default="none",
        help="example messages at the start of every run (gemma: for a base model)",
    )
    p.add_argument(
        "--keep-tools",
        action="store_true",
        help="offer tools on every turn; tool_choice none once the calls are spent",
    )
    p.add_argument("--temperature", type=float, help="sampling temperature (engine default)")
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    p.add_argument(
        "--tool-style",
        choices=TOOL_STYLES,
        default="openai",
        help="openai: tool_calls and tool messages; text: <tool_call> blocks in the content, "
        "results as user messages, no tools offered",
    )
    p.add_argument(
        "--shared-prefix-chars",
        type=int,
        default=0,
        metavar="N",
        help="open every run of every agent with the same N characters of system text",
    )
    p.add_argument(
        "--priority",
        type=_priorities,
        default=None,
        metavar="interactive=N,batch=M",
        help="send each turn the engine `priority` of its class in the body, as a router's "
        "client that knows the class would (unset: none)",
    )
    return p


def _priorities(text: str) -> tuple[tuple[str, int], ...]:
    out: dict[str, int] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in ("interactive", "batch"):
            raise argparse.ArgumentTypeError(f"not a class: {name.strip()!r}")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    return tuple(sorted(out.items()))


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> Workload:
    """The own-loop workload from argv and the environment."""
    p = build_parser()
    return _workload(p, _namespace(p, argv, environ))


def _namespace(
    p: argparse.ArgumentParser, argv: list[str], environ: Mapping[str, str] | None
) -> argparse.Namespace:
    env = os.environ if environ is None else environ
    return envargs.parse_args(p, argv, env, separators={"LUFTPAUSE_STOP": "\n"})


def _shared(a: argparse.Namespace) -> dict[str, Any]:
    """The options both kinds of load take."""
    return {
        "model": a.model,
        "interactive": a.interactive,
        "batch": a.batch,
        "context_chars": a.context_chars,
        "tool_calls": a.tool_calls,
        "window_s": a.window_s,
        "seed": a.seed,
        "callers": max(a.callers, 1),
        "max_tokens": a.max_tokens,
    }


def _workload(p: argparse.ArgumentParser, a: argparse.Namespace) -> Workload:
    """The workload the options ask for; an impossible combination exits with usage (2)."""
    try:
        return Workload(
            base_url=a.base_url,
            tool_seconds=a.tool_seconds,
            preamble=a.preamble,
            keep_tools=a.keep_tools,
            temperature=a.temperature,
            stop=tuple(a.stop),
            tool_style=a.tool_style,
            shared_prefix_chars=a.shared_prefix_chars,
            priority=a.priority or (),
            **_shared(a),
        )
    except ValueError as exc:
        p.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    """Run the workload and print its JSON (records and summary) to stdout."""
    argv = sys.argv[1:] if argv is None else argv  # as the console script calls it
    p = build_parser()
    a = _namespace(p, argv, None)
    result: dict[str, Any]
    if a.mcp_url:
        from luftpause.testkit.mcp_loadgen import McpWorkload, RuntimeUnreachable, run_mcp_workload

        try:
            result = asyncio.run(run_mcp_workload(McpWorkload(url=a.mcp_url, **_shared(a))))
        except RuntimeUnreachable as exc:
            print(f"loadgen: {exc}", file=sys.stderr)
            return 1
    else:
        result = asyncio.run(run_workload(_workload(p, a)))
    json.dump(result, sys.stdout, indent=1)
    print(file=sys.stderr)
    print(json.dumps(result["summary"], indent=1), file=sys.stderr)
    return 0
