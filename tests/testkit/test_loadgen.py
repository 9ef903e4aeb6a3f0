"""The load generator: its summary arithmetic, the requests a run sends, and a closed loop."""

from __future__ import annotations

import json
import random
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI

from luftpause.testkit import loadgen_cli
from luftpause.testkit.loadgen import Run, Workload, one_run, run_workload
from luftpause.testkit.loadgen_cli import parse_args
from luftpause.testkit.preambles import GEMMA_PREAMBLE
from luftpause.testkit.procs import free_port
from luftpause.testkit.stack import SIM_MODEL, LocalStack
from luftpause.testkit.stats import jain


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


def _sse(*chunks: dict[str, Any]) -> bytes:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    lines = [f"data: {json.dumps({**base, **c})}\n\n" for c in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _call_delta(arguments: str) -> dict[str, Any]:
    fn = {"name": "lookup", "arguments": arguments}
    return {"tool_calls": [{"index": 0, "id": "call-1", "type": "function", "function": fn}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}}


class Engine:
    """An in-memory engine: a tool call while tools may be called, else text cut at max_tokens."""

    def __init__(self, arguments: str = '{"query": "q"}') -> None:
        self.arguments = arguments
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        if body.get("tools") and body.get("tool_choice") != "none":
            reply = _sse(_choice(_call_delta(self.arguments), "length"), USAGE)
        else:
            reply = _sse(_choice({"content": "more words"}, "length"), USAGE)
        return httpx2.Response(200, content=reply, headers={"content-type": "text/event-stream"})


def _workload(**overrides: Any) -> Workload:
    fields: dict[str, Any] = {
        "base_url": "http://engine.test/v1",
        "model": "m",
        "interactive": 1,
        "batch": 0,
        "context_chars": 200,
        "tool_calls": 2,
        "tool_seconds": 0.0,
        "window_s": 1.0,
        "seed": 1,
        "callers": 1,
    }
    return Workload(**(fields | overrides))


async def _one_run(engine: Engine, wl: Workload) -> Run:
    run = Run(run_id="r", service_class="batch", caller="c", started=0.0)
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(engine))
    async with AsyncOpenAI(base_url=wl.base_url, api_key="x", http_client=http) as client:
        await one_run(client, run, wl, random.Random(1))
    return run


async def test_gemma_preamble_opens_the_run_and_spent_tools_stay_offered_with_choice_none() -> None:
    engine = Engine()
    wl = _workload(
        preamble="gemma", keep_tools=True, stop=("</tool_call>",), max_tokens=40, temperature=0.3
    )
    run = await _one_run(engine, wl)
    assert run.completed and run.turns == 3 and run.tool_calls == 2
    assert run.finish_reasons == {"length": 3}  # cut at max_tokens, still a normal end of turn
    first, last = engine.requests[0], engine.requests[-1]
    assert first["messages"][: len(GEMMA_PREAMBLE)] == GEMMA_PREAMBLE
    assert first["messages"][len(GEMMA_PREAMBLE)]["role"] == "user"
    assert "tool_choice" not in first and first["tools"] == last["tools"]
    assert last["tool_choice"] == "none"
    assert all(
        r["stop"] == ["</tool_call>"] and r["max_tokens"] == 40 and r["temperature"] == 0.3
        for r in engine.requests
    )


async def test_default_workload_sends_no_preamble_and_stops_offering_spent_tools() -> None:
    engine = Engine()
    run = await _one_run(engine, _workload())
    assert run.completed and run.turns == 3
    first, last = engine.requests[0], engine.requests[-1]
    assert [m["role"] for m in first["messages"]] == ["user"]
    assert first["max_tokens"] == 64
    assert not {"stop", "temperature", "tool_choice"} & first.keys()
    assert "tools" not in last


async def test_a_tool_call_cut_short_is_dropped_and_the_reply_ends_the_run() -> None:
    engine = Engine(arguments='{"que')
    run = await _one_run(engine, _workload())
    assert run.completed and run.turns == 1
    assert run.tool_calls == 0 and run.dropped_calls == 1


async def test_a_priority_per_class_goes_in_every_turns_body_and_none_by_default() -> None:
    engine = Engine()
    await _one_run(engine, _workload(priority=(("batch", 100), ("interactive", 0))))
    assert [r["priority"] for r in engine.requests] == [100] * len(engine.requests)
    plain = Engine()
    await _one_run(plain, _workload())
    assert all("priority" not in r for r in plain.requests)
    assert parse_args(["--priority", "interactive=0,batch=100"]).priority == (
        ("batch", 100),
        ("interactive", 0),
    )
    with pytest.raises(SystemExit):
        parse_args(["--priority", "urgent=1"])


def test_an_unknown_preamble_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown preamble"):
        _workload(preamble="llama")


def test_the_cli_selects_the_base_model_options() -> None:
    args = "--preamble gemma --keep-tools --stop </tool_call> --max-tokens 40 --temperature 0.3"
    wl = parse_args(args.split(" "))
    assert (wl.preamble, wl.keep_tools, wl.stop, wl.max_tokens, wl.temperature) == (
        "gemma",
        True,
        ("</tool_call>",),
        40,
        0.3,
    )
    default = parse_args([])
    assert (default.preamble, default.keep_tools, default.stop, default.max_tokens) == (
        "none",
        False,
        (),
        64,
    )


def test_mcp_mode_without_a_runtime_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there
    code = loadgen_cli.main(["--mcp-url", url, "--window-s", "1", "--batch", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("loadgen: no runtime answers at") and "\n" not in err
