"""Money budgets, `forecast` and the seconds budget that looks ahead, on a real `Runtime`
(engine simulator, fake MCP server, real journal; all on 127.0.0.1 in this process) driven
through its MCP tools by the official client's in-memory connection.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from mcp import Client

from luftpause.runtime.core import status_tree
from luftpause.runtime.core.price_table import parse_prices
from luftpause.runtime.journal.file import JOURNAL_NAME, JournalFile
from luftpause.runtime.loop.llm import Llm
from luftpause.runtime.loop.runtime import Runtime
from luftpause.runtime.loop.upstream import Upstreams
from luftpause.runtime.main import main, parse_args
from luftpause.runtime.plans.planner import NO_SCHEDULER, Planner
from luftpause.runtime.plans.scheduler_status import SchedulerStatus
from luftpause.runtime.server.app import build_server
from luftpause.testkit.engine.server import RunningServer
from tests.runtime.loopback import MODEL, FakeMcp, closed_port, engine, fake_mcp
from tests.runtime.test_server import ok, refused

WAIT = 10.0
ROUNDS = 2
PRICES = parse_prices(
    {
        "prices": {
            MODEL: {"input": 0.15, "cached_input": 0.075, "output": 0.60, "context_window": 4096},
            "free-model": {"context_window": 4096},
        }
    }
)


@asynccontextmanager
async def runtime_at(
    state_dir: Path, model_url: str, tool_url: str, planner: Planner | None = None
) -> AsyncIterator[Runtime]:
    upstreams = Upstreams([tool_url])
    upstreams.start()
    llm = Llm(model_url, timeout=10.0)
    runtime = Runtime(JournalFile(state_dir), llm, upstreams, planner=planner)
    runtime.resume()
    try:
        yield runtime
    finally:
        await runtime.stop()
        await upstreams.close()
        await llm.close()


@pytest.fixture
async def model() -> AsyncIterator[RunningServer]:
    async with engine(tool_rounds=ROUNDS) as server:
        yield server


@pytest.fixture
async def tools() -> AsyncIterator[FakeMcp]:
    async with fake_mcp(deep_search=5.0) as fake:
        yield fake


@pytest.fixture
async def runtime(tmp_path: Path, model: RunningServer, tools: FakeMcp) -> AsyncIterator[Runtime]:
    async with runtime_at(tmp_path, model.url, tools.url, Planner(prices=PRICES)) as rt:
        yield rt


def connect(runtime: Runtime) -> Client:
    return Client(build_server(runtime, default_model=MODEL))


def records(state_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state_dir / JOURNAL_NAME).read_text().splitlines()]


def seed(state_dir: Path, *, call_seconds: float, answer_seconds: float) -> None:
    """A journal holding one finished run of MODEL: two rounds whose turns took `call_seconds`,
    then its answer."""

    def usage(seconds: float) -> dict[str, Any]:
        return {"turns": 1, "promptTokens": 300, "completionTokens": 12, "turnSeconds": seconds}

    spec = {"handle": "run-old", "task": "t", "model": MODEL}
    rounds: list[dict[str, Any]] = [
        {
            "v": 1,
            "type": "round",
            "run": "run-old",
            "round": n,
            "assistant": {"role": "assistant", "content": None, "tool_calls": []},
            "results": [],
            "usage": usage(call_seconds),
        }
        for n in (1, 2)
    ]
    lines = [
        {"v": 1, "type": "spawned", "run": "run-old", "spec": spec},
        *rounds,
        {
            "v": 1,
            "type": "finished",
            "run": "run-old",
            "state": "finished",
            "result": "r",
            "error": None,
            "usage": usage(answer_seconds),
            "at": 1.0,
        },
    ]
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / JOURNAL_NAME).write_text("".join(json.dumps(r) + "\n" for r in lines))


# --- bad arguments ---


@pytest.mark.parametrize(
    ("tool", "args", "says"),
    [
        ("forecast", {"handle": "run-nope"}, "no run run-nope"),
        ("forecast", {"handle": "run-nope", "steps": 0}, "steps"),
        ("forecast", {"handle": "run-nope", "steps": "many"}, "steps"),
        ("forecast", {}, "handle"),
        ("spawn", {"task": "t", "budgetUsd": -1}, "budgetUsd"),
        ("spawn", {"task": "t", "budgetUsd": "cheap"}, "budgetUsd"),
        ("run", {"task": "t", "budgetUsd": -0.5}, "budgetUsd"),
        ("spawn", {"task": "t", "model": "free-model", "budgetUsd": 1}, "needs a price"),
        ("spawn", {"task": "t", "model": "other", "budgetUsd": 1}, "needs a price for model"),
    ],
)
async def test_bad_arguments_are_a_tool_error_that_says_what_is_wrong(
    runtime: Runtime, tool: str, args: dict[str, Any], says: str
) -> None:
    async with connect(runtime) as client:
        message = await refused(client, tool, args)
    assert says in message, message
    assert runtime.runs == {}


# --- money ---


async def test_a_priced_run_shows_its_cost_and_its_subtrees_and_counts_its_spend(
    runtime: Runtime, tmp_path: Path
) -> None:
    async with connect(runtime) as client:
        parent = await ok(client, "run", {"task": "p", "maxToolCalls": 0, "timeout": WAIT})
        child = await ok(
            client,
            "run",
            {"task": "c", "tools": ["lookup"], "parent": parent["handle"], "timeout": WAIT},
        )
        [after] = (await ok(client, "status", {"handles": [parent["handle"]]}))["runs"]
    own, sub = parent["spend"], after["spend"]
    assert own["usd"] > 0 and own["tokens"] > 0 and own["subtreeUsd"] == own["usd"]
    assert sub["subtreeUsd"] == pytest.approx(own["usd"] + child["spend"]["usd"], rel=1e-5)
    assert sub["subtreeTokens"] == own["tokens"] + child["spend"]["tokens"]
    [spec] = [r["spec"] for r in records(tmp_path) if r["type"] == "spawned"][:1]
    assert spec["price"] == {"input": 0.15, "cachedInput": 0.075, "output": 0.6}
    metrics = runtime.metrics.render().decode()
    assert f'luftpause_runtime_spend_usd_total{{model="{MODEL}"}}' in metrics
    [node] = status_tree.status(runtime.runs, runtime.clock())["tree"]
    assert node["own"]["usd"] == own["usd"] and node["subtree"]["usd"] == sub["subtreeUsd"]
    assert node["children"][0]["own"]["usd"] == child["spend"]["usd"]


async def test_a_usd_budget_cancels_its_subtree_with_the_reason(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        args = {"task": "spendy", "tools": ["lookup"], "budgetUsd": 0.000001, "timeout": WAIT}
        out = await ok(client, "run", args)
        late = await client.call_tool("spawn", {"task": "late", "parent": out["handle"]})
    assert out["state"] == "cancelled" and out["error"].startswith("budget exceeded: usd ")
    assert out["budget"]["exceeded"]["which"] == "usd" and out["spend"]["tokens"] > 0
    assert late.is_error


async def test_a_run_without_a_price_shows_no_cost_rather_than_zero(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        out = await ok(client, "run", {"task": "t", "model": MODEL, "timeout": WAIT})
        free = await ok(client, "spawn", {"task": "t", "model": "free-model"})
        [status] = (await ok(client, "status", {"handles": [free["handle"]]}))["runs"]
    assert out["spend"]["usd"] > 0
    assert status["spend"]["usd"] is None and status["spend"]["subtreeUsd"] is None


# --- forecast ---


async def test_status_forecasts_a_live_run_and_the_tool_forecasts_any(runtime: Runtime) -> None:
    async with connect(runtime) as client:
        warm = await ok(client, "run", {"task": "warm", "tools": ["lookup"], "timeout": WAIT})
        slow = await ok(client, "spawn", {"task": "slow", "tools": ["deep_search"]})
        [live, done] = (await ok(client, "status", {"handles": [slow["handle"], warm["handle"]]}))[
            "runs"
        ]
        steps = await ok(client, "forecast", {"handle": slow["handle"], "steps": 1})
        over = await ok(client, "forecast", {"handle": warm["handle"]})
    f = live["forecast"]
    assert "forecast" not in done and over["horizon"]["until"] == "over"
    assert f["horizon"]["steps"] >= 2 and f["tokens"]["total"] > 0 and f["usd"]["expected"] > 0
    assert f["seconds"]["total"] > 0 and f["context"]["window"] == 4096
    assert NO_SCHEDULER in f["notes"] and f["seconds"]["waits"] == 0
    assert steps["horizon"] == {"steps": 1, "toolCalls": 1.0, "until": "steps"}


async def test_the_ledger_is_replayed_from_the_journal_after_a_restart(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with runtime_at(tmp_path, model.url, tools.url, Planner(prices=PRICES)) as rt:
        async with connect(rt) as client:
            await ok(client, "run", {"task": "t", "tools": ["lookup"], "timeout": WAIT})
        learned = rt.planner.ledger.stats(MODEL)
    async with runtime_at(tmp_path, model.url, tools.url) as again:
        assert again.planner.ledger.stats(MODEL) == learned and learned.turns == ROUNDS + 1


# --- the seconds budget looks ahead ---


async def test_a_run_stops_before_a_turn_its_seconds_budget_would_not_see_finish(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    seed(tmp_path, call_seconds=30.0, answer_seconds=30.0)
    async with runtime_at(tmp_path, model.url, tools.url) as rt, connect(rt) as client:
        args = {"task": "t", "tools": ["lookup"], "budgetSeconds": 10, "timeout": WAIT}
        out = await ok(client, "run", args)
        trips = rt.metrics.render().decode()
    assert out["state"] == "cancelled" and out["turns"] == 0, out
    assert out["error"].startswith("budget exceeded: seconds (predicted) 0")
    assert out["error"].endswith("+30/10")
    mine = [r for r in records(tmp_path) if r["run"] == out["handle"]]
    assert [r["type"] for r in mine] == ["spawned", "exceeded", "finished"]
    assert mine[1]["which"] == "seconds" and mine[1]["predicted"] == 30.0
    assert mine[2]["state"] == "cancelled" and mine[2]["error"] == out["error"]
    assert 'luftpause_runtime_budget_trips_total{kind="seconds"} 1.0' in trips


async def test_a_run_does_its_short_rounds_and_stops_before_a_long_answer(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    seed(tmp_path, call_seconds=0.001, answer_seconds=30.0)
    async with runtime_at(tmp_path, model.url, tools.url) as rt, connect(rt) as client:
        args = {"task": "t", "tools": ["lookup"], "maxToolCalls": ROUNDS, "budgetSeconds": 10}
        args["timeout"] = WAIT
        out = await ok(client, "run", args)
    assert out["state"] == "cancelled" and out["toolCalls"] == ROUNDS and out["turns"] == ROUNDS
    assert "(predicted)" in out["error"] and out["error"].endswith("+30/10")


# --- flags ---


def test_the_runtime_takes_prices_and_the_schedulers_url_from_flags_or_variables() -> None:
    given = parse_args(["--prices", "p.yaml", "--scheduler-url", "http://s:5001"], {})
    assert (given.prices_file, given.scheduler_url) == (Path("p.yaml"), "http://s:5001")
    env = {"LUFTPAUSE_PRICES": "q.toml", "LUFTPAUSE_SCHEDULER_URL": "https://s"}
    from_env = parse_args([], env)
    assert (from_env.prices_file, from_env.scheduler_url) == (Path("q.toml"), "https://s")
    with pytest.raises(SystemExit):
        parse_args(["--scheduler-url", "s:5001"], {})


def test_a_bad_prices_file_stops_the_runtime_at_start_saying_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "prices.yaml"
    bad.write_text("prices:\n  m: {input: -1, output: 1}\n")
    assert main(["--prices", str(bad), "--state-dir", str(tmp_path)]) == 2
    assert "prices.m.input must be a number >= 0" in capsys.readouterr().err


# --- the scheduler's windows ---


def tight_window(available: int) -> dict[str, Any]:
    """A scheduler /status whose one endpoint serving MODEL has `available` of 3000 tokens a
    minute left, refilled in 30 s."""
    dims = [{"name": "tokens", "limit": 3000, "available": available, "reserved": 0}]
    dims[0]["refill_s"] = 30.0
    window = {"id": "endpoint:e", "kind": "endpoint", "replicas": ["e"], "dimensions": dims}
    return {"replicas": [{"id": "e", "models": [MODEL]}], "budgets": [window]}


@asynccontextmanager
async def scheduler_status(doc: dict[str, Any]) -> AsyncIterator[tuple[str, list[int]]]:
    """A stand-in for the scheduler's HTTP port answering GET /status with `doc`."""
    hits: list[int] = []

    async def status(request: web.Request) -> web.Response:
        hits.append(1)
        return web.json_response(doc)

    app = web.Application()
    app.router.add_get("/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", hits
    finally:
        await runner.cleanup()


async def test_a_tight_rate_limit_window_adds_its_waits_to_the_forecast(
    tmp_path: Path, model: RunningServer, tools: FakeMcp
) -> None:
    async with scheduler_status(tight_window(available=500)) as (url, hits):
        planner = Planner(prices=PRICES, scheduler_url=url)
        async with runtime_at(tmp_path, model.url, tools.url, planner) as rt, connect(rt) as c:
            await ok(c, "run", {"task": "warm", "tools": ["lookup"], "timeout": WAIT})
            slow = await ok(c, "spawn", {"task": "slow", "tools": ["deep_search"]})
            first = await ok(c, "forecast", {"handle": slow["handle"]})
            await ok(c, "forecast", {"handle": slow["handle"]})
        await planner.close()
    assert first["seconds"]["waits"] > 0 and any(s["waitSeconds"] > 0 for s in first["steps"])
    assert first["seconds"]["total"] >= first["seconds"]["waits"]
    assert len(hits) == 1  # read at most once a second


async def test_an_unreachable_scheduler_means_no_waits_and_is_not_asked_again_at_once() -> None:
    clock = [0.0]
    status = SchedulerStatus(f"http://127.0.0.1:{closed_port()}", clock=lambda: clock[0])
    doc, note = await status.read()
    assert doc is None and note is not None and "unreachable" in note
    clock[0] = 5.0
    assert await status.read() == (None, note)  # within the retry pause: the same answer
    await status.close()
