"""The load generator: its summary arithmetic, and a short closed loop through the stack."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

from luftpause.testkit.loadgen import Workload, jain, run_workload
from luftpause.testkit.stack import SIM_MODEL, LocalStack


def test_jain_index_is_one_when_callers_are_served_equally() -> None:
    assert jain([5.0, 5.0, 5.0]) == 1.0


def test_jain_index_is_one_over_n_when_one_caller_gets_everything() -> None:
    assert jain([9.0, 0.0, 0.0]) == round(1 / 3, 4)
    assert jain([]) is None


async def test_closed_loop_runs_finish_and_are_summarised_per_class(tmp_path: Path) -> None:
    async with AsyncExitStack() as exits:
        stack = await LocalStack(tmp_path, engine_args=("--time-scale", "50")).start(exits)
        await stack.wait_healthy()
        wl = Workload(
            base_url=stack.base_url,
            model=SIM_MODEL,
            interactive=2,
            batch=4,
            context_chars=2000,
            tool_calls=2,
            tool_seconds=0.05,
            window_s=4.0,
            seed=3,
            callers=2,
        )
        result = await run_workload(wl)
    summary = result["summary"]
    for cls in ("interactive", "batch"):
        assert summary[cls]["runs_per_min"] > 0
        assert summary[cls]["errors"] == 0
        assert summary[cls]["runs_moved"] == 0
        assert summary[cls]["ttft_p50_s"] is not None
    done = [r for r in result["runs"] if r["completed"]]
    assert done and all(r["turns"] == 3 for r in done)  # two tool calls, then the answer
    assert any(r["cached_tokens"] > 0 for r in done)  # later turns reuse the run's prefix
