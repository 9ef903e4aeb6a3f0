"""The sub-agent load end to end: mcp_loadgen -> runtime (official `mcp` SDK) -> dataplane ->
two simulated engines, tool calls to fake-mcp. A few agents, one run each; then the same through
`luftpause loadgen --mcp-url`.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path

from luftpause.testkit.mcp_loadgen import McpWorkload, run_mcp_workload
from luftpause.testkit.procs import luftpause_exe
from luftpause.testkit.stack import LocalStack, start_runtime

TOOL_CALLS = 2
# Fast simulated time, GPU-class speeds (the default CPU profile is slow for 2,000-char tasks).
ENGINE_ARGS = (
    "--time-scale",
    "20",
    "--tool-rounds",
    str(TOOL_CALLS),
    "--prefill-ms-per-token",
    "0.1",
    "--decode-base-ms",
    "15",
)


async def test_every_agents_run_finishes_through_the_runtime_with_its_tool_calls(
    tmp_path: Path,
) -> None:
    async with AsyncExitStack() as exits:
        stack = await LocalStack(tmp_path, engine_args=ENGINE_ARGS).start(exits)
        url = (await start_runtime(exits, tmp_path, stack.base_url.removesuffix("/v1"))).mcp_url
        await stack.wait_healthy()
        wl = McpWorkload(
            url=url,
            interactive=2,
            batch=4,
            context_chars=2000,
            tool_calls=TOOL_CALLS,
            window_s=20.0,  # a bound only: each agent stops after its one run
            seed=3,
            callers=2,
            runs_per_agent=1,
        )
        result = await run_mcp_workload(wl)
        cli = await asyncio.create_subprocess_exec(
            luftpause_exe(),
            "loadgen",
            "--mcp-url",
            url,
            *("--interactive", "1", "--batch", "1", "--window-s", "10"),
            *("--context-chars", "500", "--tool-calls", str(TOOL_CALLS)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0
    from_cli = json.loads(out)
    assert from_cli["summary"]["batch"]["errors"] == 0
    assert any(r["state"] == "finished" for r in from_cli["runs"])
    runs = result["runs"]
    assert len(runs) == 6
    assert all(r["state"] == "finished" and r["error"] is None for r in runs), runs
    assert all(r["tool_calls"] == TOOL_CALLS and r["turns"] == TOOL_CALLS + 1 for r in runs)
    assert all(r["prompt_tokens"] > 0 for r in runs)
    assert all(r["cached_tokens"] is not None for r in runs)
    assert {r["caller"] for r in runs} == {"caller-0", "caller-1"}
    summary = result["summary"]
    assert summary["interactive"]["runs_finished"] == 2
    assert summary["batch"]["runs_finished"] == 4
    assert summary["batch"]["errors"] == 0
    assert summary["batch"]["ttft_p50_s"] is None  # the runtime's turns do not stream
