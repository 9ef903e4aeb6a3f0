"""Claude Code told to look six things up with sub-agents: all six at once, against one at a time.

Run: `.venv/bin/python -m bench.claude_fanout [--repeats 3] [--agents 6] [--tool-seconds 1]`.
The original's demonstration, measured here with the real program: Claude Code (the pinned
harness, `make install`), in print mode, its own loop through the dataplane's `/v1/messages`
and the runtime as its MCP server, on two simulated engines (the GPU-class profile, in real
time: `--time-scale 1`). The simulated model follows a script of replies:

- arm "fan-out": one reply spawning all the sub-agents, then one `await` of all of them, then
  the answer (three turns of Claude Code's);
- arm "one at a time": one `run` per sub-agent (spawn and wait in one call), each in its own
  reply, then the answer.

Both end with the same one-line answer.

Each sub-agent calls fake-mcp's `lookup` three times (each call `--tool-seconds`), then answers.
Arms alternate their order from repeat to repeat (`common.rotated`); every session gets a fresh
home. Measured per session: the wall time of the `claude` process (start to exit, what a person
waits), the sub-agents' time each (turns plus tool calls, from the runtime's run tree) and the
machine's load while it ran (`common.LoadWatch`). Writes bench/results/claude_fanout.json: every
session, then per arm the median and min..max, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bench.common import LoadWatch, rotated, write_result
from luftpause.testkit.harnesses import ClaudeCode, HarnessStack, pinned, start_harness_stack

ENGINE_ARGS = ("--profile", "gpu", "--time-scale", "1", "--kv-tokens", "400000")
TOOL_ROUNDS = 3
TOPICS = ("Loire", "Rhine", "Danube", "Elbe", "Oder", "Vistula", "Tagus", "Ebro")
ARMS = ("fan-out", "one at a time")


def _task(topic: str) -> dict[str, Any]:
    return {"task": f"How long is the {topic}?", "tools": ["lookup"]}


def script(arm: str, agents: int) -> dict[str, Any]:
    """The replies of one session of `arm`."""
    topics = TOPICS[:agents]
    # The same short answer in both arms: quoting every result would make the fan-out arm's
    # last reply six times as long to decode.
    answer = {"text": f"All {agents} rivers are looked up."}
    if arm == "fan-out":
        spawn = [{"name": "mcp__luftpause__spawn", "arguments": _task(t)} for t in topics]
        wait = {"handles": {"$collect": "handle"}, "timeout": 55}
        replies = [
            {"calls": spawn},
            {"calls": [{"name": "mcp__luftpause__await", "arguments": wait}]},
            answer,
        ]
    else:
        replies = [
            {"calls": [{"name": "mcp__luftpause__run", "arguments": {**_task(t), "timeout": 55}}]}
            for t in topics
        ]
        replies.append(answer)
    return {"offers": ["mcp__luftpause__spawn", "mcp__luftpause__run"], "replies": replies}


async def session(stack: HarnessStack, arm: str, agents: int, home: Path) -> dict[str, Any]:
    """One Claude Code session of `arm`; what it took."""
    await stack.script(script(arm, agents))
    known = {run["handle"] for run in await stack.runs()}
    claude = ClaudeCode(base_url=stack.dataplane, home=home, api_key=stack.token)
    config = claude.mcp_config("luftpause", stack.mcp, {"Authorization": f"Bearer {stack.token}"})
    ran = await claude.run(
        f"Look up the lengths of {agents} rivers, each with a sub-agent.",
        cwd=home,
        mcp_config=config,
        allowed_tools=["mcp__luftpause__spawn", "mcp__luftpause__await", "mcp__luftpause__run"],
        extra_env={"ENABLE_TOOL_SEARCH": "false"},
        timeout=600,
    )
    if ran.returncode != 0:
        raise RuntimeError(f"claude exited {ran.returncode}: {ran.stderr[-2000:]}")
    output = ran.json()
    runs = [run for run in await stack.runs() if run["handle"] not in known]
    if len(runs) != agents or any(run["state"] != "finished" for run in runs):
        raise RuntimeError(f"{arm}: expected {agents} finished sub-agents, got {runs}")
    busy = [run["own"]["turnSeconds"] + run["own"]["toolSeconds"] for run in runs]
    return {
        "arm": arm,
        "seconds": round(ran.seconds, 3),
        "claude_duration_s": round(output["duration_ms"] / 1000, 3),
        "sub_agents": len(runs),
        "sub_agent_tool_calls": sum(run["own"]["toolCalls"] for run in runs),
        "sub_agent_seconds_p50": round(statistics.median(busy), 3),
        "sub_agent_seconds_max": round(max(busy), 3),
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


async def bench(repeats: int, agents: int, tool_seconds: float) -> dict[str, Any]:
    sessions: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-claude-fanout-") as tmp:
        async with AsyncExitStack() as exits:
            stack = await start_harness_stack(
                exits,
                Path(tmp),
                engine_args=(*ENGINE_ARGS, "--tool-rounds", str(TOOL_ROUNDS)),
                tool_seconds=tool_seconds,
            )
            # A first session warms the engines' prefix caches with Claude Code's system prompt
            # and tools, as any session after the first finds them; it is not counted.
            await session(stack, "fan-out", agents, Path(tmp) / "warm-up")
            for r in range(repeats):
                for arm in rotated(ARMS, r):
                    home = Path(tmp) / f"home-{r}-{arm.replace(' ', '-')}"
                    with LoadWatch() as load:
                        ran = await session(stack, arm, agents, home)
                    sessions.append({"repeat": r, **ran, "load": load.summary()})
                    print(sessions[-1], flush=True)
    per_arm = {arm: [s for s in sessions if s["arm"] == arm] for arm in ARMS}
    summary = {
        arm: {
            "seconds": _spread([s["seconds"] for s in runs]),
            "sub_agent_seconds_p50": _spread([s["sub_agent_seconds_p50"] for s in runs]),
        }
        for arm, runs in per_arm.items()
    }
    fan, one = (summary[arm]["seconds"]["median"] for arm in ARMS)
    return {
        "claude_code": pinned("claude"),
        "agents": agents,
        "tool_rounds": TOOL_ROUNDS,
        "tool_seconds": tool_seconds,
        "engine_args": list(ENGINE_ARGS),
        "repeats": repeats,
        "sessions": sessions,
        "summary": summary,
        "speedup": round(one / fan, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--agents", type=int, default=6, choices=range(1, len(TOPICS) + 1))
    parser.add_argument("--tool-seconds", type=float, default=1.0)
    parser.add_argument("--out", default="claude_fanout")
    args = parser.parse_args()
    result = asyncio.run(bench(args.repeats, args.agents, args.tool_seconds))
    path = write_result(args.out, result)
    print(path, result["summary"], "speedup", result["speedup"])


if __name__ == "__main__":
    main()
