"""The `luftpause` console script: one subcommand per process.

Shell layer: parses only the subcommand name and hands the rest of argv to that
process's own `main(argv) -> int`, imported lazily so `luftpause fake-engine`
never imports the scheduler and vice versa.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "scheduler": ("luftpause.scheduler.main", "the scheduler: gRPC :5000, HTTP status :5001"),
    "dataplane": ("luftpause.dataplane.main", "the OpenAI-compatible proxy on :8080"),
    "runtime": ("luftpause.runtime.main", "the MCP runtime: durable sub-agents on :7000/mcp"),
    "fake-engine": ("luftpause.testkit.engine.main", "the engine simulator"),
    "fake-mcp": ("luftpause.testkit.fakemcp", "an MCP tool server with lookup and deep_search"),
    "llama-engine": ("luftpause.testkit.llamacpp", "llama.cpp serving Gemma 3 270M (`real` extra)"),
    "loadgen": ("luftpause.testkit.loadgen_cli", "closed-loop own-loop agents against a base URL"),
    "up": ("luftpause.up", "the whole local stack as child processes"),
    "keys": ("luftpause.common.keys_cli", "hash a caller key, or make a new one"),
}


def _usage() -> str:
    lines = ["usage: luftpause <subcommand> [options]", "", "subcommands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the named subcommand's `main(argv)`."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"luftpause: unknown subcommand {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    sys.exit(main())
