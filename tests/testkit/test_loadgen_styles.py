"""The load generator's text tool style and shared preamble.

Request shapes are checked against an in-memory engine; closed loops and prefix caching run
against an in-process simulator on loopback. Every wait is bounded by the client's timeout or
the workload's window.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI

from luftpause.testkit.engine.params import EngineParams, SimParams
from luftpause.testkit.engine.server import RunningServer, serve
from luftpause.testkit.loadgen import (
    LAST_CALL_NOTE,
    Run,
    Workload,
    one_run,
    run_workload,
)
from luftpause.testkit.loadgen_cli import parse_args
from luftpause.testkit.preambles import (
    GEMMA_PREAMBLE,
    TEXT_TOOL_SYSTEM,
    opening,
    shared_prefix,
    text_tool_calls,
)

FAST = EngineParams(prefill_ms_per_token=0.01, decode_base_ms=1.0, decode_ms_per_seq=0.0)
CALL = '<tool_call>{"name": "lookup", "arguments": {"query": "q"}}</tool_call>'


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


def _sse(text: str) -> bytes:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    delta = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]}
    use = {
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
    }
    lines = [f"data: {json.dumps({**base, **c})}\n\n" for c in (delta, use)]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


class TextEngine:
    """An in-memory engine in the text tool style: `reply` while K calls are not spent."""

    def __init__(self, reply: str = CALL) -> None:
        self.reply = reply
        self.requests: list[tuple[dict[str, Any], httpx2.Headers]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        self.requests.append((body, request.headers))
        written = sum(
            1
            for m in body["messages"]
            if m["role"] == "assistant" and "<tool_call>" in m["content"]
        )
        text = self.reply if written < int(request.headers["x-sim-tool-rounds"]) else "Done."
        headers = {"content-type": "text/event-stream"}
        return httpx2.Response(200, content=_sse(text), headers=headers)


async def _one_run(engine: Any, wl: Workload, seed: int = 1) -> Run:
    run = Run(run_id="r", service_class="batch", caller="c", started=0.0)
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(engine))
    async with AsyncOpenAI(base_url=wl.base_url, api_key="x", http_client=http) as client:
        await one_run(client, run, wl, random.Random(seed))
    return run


async def test_a_text_style_run_sends_no_tools_and_answers_calls_with_user_messages() -> None:
    engine = TextEngine()
    run = await _one_run(engine, _workload(tool_style="text"))
    assert run.completed and run.turns == 3 and run.tool_calls == 2 and run.dropped_calls == 0
    assert run.finish_reasons == {"stop": 3}
    for body, headers in engine.requests:
        assert not {"tools", "tool_choice"} & body.keys()
        assert headers["x-sim-tool-style"] == "text" and headers["x-sim-tool-rounds"] == "2"
        assert body["messages"][0] == {"role": "system", "content": TEXT_TOOL_SYSTEM}
    last = engine.requests[-1][0]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert last[2] == {"role": "assistant", "content": CALL}
    assert last[3]["content"] == "<tool_response>42 km</tool_response>"
    assert last[5]["content"] == f"<tool_response>42 km</tool_response>\n{LAST_CALL_NOTE}"


async def test_a_malformed_text_call_is_dropped_and_ends_the_run() -> None:
    engine = TextEngine(reply='<tool_call>{"name": "lookup", "argu')
    run = await _one_run(engine, _workload(tool_style="text"))
    assert run.completed and run.turns == 1
    assert run.tool_calls == 0 and run.dropped_calls == 1


async def test_the_openai_style_sends_no_text_style_header() -> None:
    engine = TextEngine()
    await _one_run(engine, _workload(tool_calls=0))
    (body, headers), *_ = engine.requests
    assert "x-sim-tool-style" not in headers and body["messages"][0]["role"] == "user"


def test_text_calls_parse_without_a_closing_tag_cut_off_by_a_stop_string() -> None:
    assert text_tool_calls(CALL.removesuffix("</tool_call>"))[0][0]["name"] == "lookup"
    assert text_tool_calls(f"Let me check. {CALL} and {CALL}") == (
        [{"name": "lookup", "arguments": {"query": "q"}}] * 2,
        0,
    )
    assert text_tool_calls("<tool_call>[1, 2]</tool_call><tool_call>{") == ([], 2)
    assert text_tool_calls("The answer is 42 km.") == ([], 0)


def test_text_calls_parse_when_max_tokens_cut_the_closing_tag_short() -> None:
    for cut in ("</", "</tool_", "</tool_call"):
        calls, dropped = text_tool_calls("42 km.\n" + CALL.removesuffix("</tool_call>") + cut)
        assert calls == [{"name": "lookup", "arguments": {"query": "q"}}] and dropped == 0
    assert text_tool_calls(CALL.removesuffix("</tool_call>") + " and more") == ([], 1)


def test_the_shared_prefix_is_fixed_text_of_the_asked_length() -> None:
    assert len(shared_prefix(3000)) == 3000 and shared_prefix(3000) == shared_prefix(3000)
    assert shared_prefix(0) == ""


def test_one_system_message_opens_a_run_shared_text_first() -> None:
    shared = shared_prefix(500)
    text = opening("none", shared_chars=500, text_tools=True)
    assert text == [{"role": "system", "content": f"{shared}\n\n{TEXT_TOOL_SYSTEM}"}]
    gemma = opening("gemma", shared_chars=500, text_tools=False)
    assert gemma[0] == {"role": "system", "content": f"{shared}\n\n{GEMMA_PREAMBLE[0]['content']}"}
    assert gemma[1:] == GEMMA_PREAMBLE[1:]
    assert opening("gemma", shared_chars=0, text_tools=False) == GEMMA_PREAMBLE
    assert opening("none", shared_chars=0, text_tools=False) == []


def test_the_cli_selects_the_tool_style_and_shared_prefix() -> None:
    wl = parse_args(["--tool-style", "text", "--shared-prefix-chars", "3000"])
    assert (wl.tool_style, wl.shared_prefix_chars) == ("text", 3000)
    default = parse_args([])
    assert (default.tool_style, default.shared_prefix_chars) == ("openai", 0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tool_style": "xml"}, "unknown tool style"),
        ({"tool_style": "text", "preamble": "gemma"}, "in the openai tool style"),
        ({"preamble": "gemma-text"}, "in the text tool style"),
        ({"tool_style": "text", "keep_tools": True}, "text tool style"),
        ({"shared_prefix_chars": -1}, "shared_prefix_chars"),
    ],
)
def test_impossible_workloads_are_refused(overrides: dict[str, Any], message: str) -> None:
    """A preamble's examples must be in the run's tool style; text style offers no tools."""
    with pytest.raises(ValueError, match=message):
        _workload(**overrides)


def test_the_cli_refuses_text_style_with_the_gemma_preamble(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--tool-style", "text", "--preamble", "gemma"])
    assert exit_info.value.code == 2
    assert "in the openai tool style, not text" in capsys.readouterr().err


@asynccontextmanager
async def _engine() -> AsyncIterator[RunningServer]:
    server = await serve(SimParams(engine=FAST, time_scale=1000.0))
    try:
        yield server
    finally:
        await server.close()


async def test_a_text_style_closed_loop_completes_runs_with_k_calls_each() -> None:
    async with _engine() as server:
        wl = _workload(
            base_url=server.url + "/v1",
            interactive=2,
            batch=2,
            context_chars=1000,
            tool_calls=2,
            tool_seconds=0.01,
            window_s=1.5,
            tool_style="text",
            shared_prefix_chars=800,
        )
        result = await run_workload(wl)
    for cls in ("interactive", "batch"):
        summary = result["summary"][cls]
        assert summary["runs_per_min"] > 0 and summary["errors"] == 0
        assert summary["tool_calls_per_run"] == 2
    done = [r for r in result["runs"] if r["completed"]]
    assert done and all(r["turns"] == 3 and r["dropped_calls"] == 0 for r in done)
    assert all(r["finish_reasons"] == {"stop": 3} for r in done)


async def _first_turns(wl: Workload) -> list[Run]:
    """Two runs of one agent, each a single turn (no tool calls), one after the other."""
    runs = [Run(run_id=f"r{i}", service_class="batch", caller="c", started=0.0) for i in (1, 2)]
    rng = random.Random(7)
    async with _engine() as server:
        url = server.url + "/v1"
        async with AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=20) as client:
            for run in runs:
                await one_run(client, run, wl, rng)
    assert all(r.completed and r.turns == 1 for r in runs)
    return runs


# No tool calls, so no tools are offered: the rendered tools would be a shared prefix too.
async def test_runs_without_a_shared_prefix_find_nothing_of_each_other_cached() -> None:
    first, second = await _first_turns(_workload(tool_calls=0, context_chars=2000))
    assert first.cached_tokens == 0 and second.cached_tokens == 0


async def test_a_new_runs_first_turn_finds_the_shared_prefix_cached() -> None:
    wl = _workload(tool_calls=0, context_chars=2000, shared_prefix_chars=2000)
    first, second = await _first_turns(wl)
    assert first.cached_tokens == 0
    # 2000 shared characters are 500 tokens, 31 full blocks of 16; the task is not shared.
    assert 31 * 16 <= second.cached_tokens < second.prompt_tokens - 400


def test_the_gemma_text_preamble_shows_calls_written_in_replies_for_the_text_style() -> None:
    wl = _workload(tool_style="text", preamble="gemma-text")
    messages = opening(wl.preamble, shared_chars=0, text_tools=True)
    assert messages[0]["role"] == "system" and "<tool_call>" in messages[0]["content"]
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    calls = [text_tool_calls(r)[0] for r in replies]
    assert [len(c) for c in calls] == [1, 0, 1, 1, 0]
    assert all("tool_calls" not in m and m["role"] != "tool" for m in messages)
