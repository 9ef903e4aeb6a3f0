"""The sub-agent load end to end: mcp_loadgen -> runtime (official `mcp` SDK) -> dataplane ->
two simulated engines, tool calls to fake-mcp. A few agents, one run each.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

from luftpause.testkit.mcp_loadgen import McpWorkload, run_mcp_workload
from luftpause.testkit.procs import Proc, free_port
from luftpause.testkit.stack import LocalStack

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


async def _runtime(exits: AsyncExitStack, workdir: Path, stack: LocalStack) -> str:
    mcp_port, port = free_port(), free_port()
    fake = Proc(
        ["fake-mcp", "--port", str(mcp_port), "--lookup-latency", "0.05"],
        name="fake-mcp",
        log_path=workdir / "fake-mcp.log",
    )
    await fake.start()
    exits.push_async_callback(fake.stop)
    await fake.wait_http(f"http://127.0.0.1:{mcp_port}/health")
    runtime = Proc(
        [
            "runtime",
            "--port",
            str(port),
            "--state-dir",
            str(workdir / "state"),
            "--dataplane",
            f"http://127.0.0.1:{stack.dataplane_port}",
            "--mcp-server",
            f"http://127.0.0.1:{mcp_port}/mcp",
        ],
        name="runtime",
        log_path=workdir / "runtime.log",
    )
    await runtime.start()
    exits.push_async_callback(runtime.stop)
    await runtime.wait_http(f"http://127.0.0.1:{port}/status")
    return f"http://127.0.0.1:{port}/mcp"


async def test_every_agents_run_finishes_through_the_runtime_with_its_tool_calls(
    tmp_path: Path,
) -> None:
    async with AsyncExitStack() as exits:
        stack = await LocalStack(tmp_path, engine_args=ENGINE_ARGS).start(exits)
        url = await _runtime(exits, tmp_path, stack)
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
