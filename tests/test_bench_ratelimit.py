"""The rate-limit benchmark: its plans, limits, arms' settings and figures (pure), and its quick
run (slow)."""

from __future__ import annotations

import importlib.util
from collections import Counter
from typing import Any

import openai
import pytest

import bench.ratelimit
from bench.common import rotated
from bench.ratelimit import parse_args, run
from bench.ratelimit_agents import BudgetSplit
from bench.ratelimit_arms import align_wait_s, luftpause_endpoints
from bench.ratelimit_plan import (
    ARMS,
    DEFAULT_SCENARIOS,
    LITELLM_ROUTER,
    SCENARIOS,
    STRESS_SCENARIOS,
    Charged,
    Provider,
    Shape,
    budget_weights,
    client_retries,
    earliest_seconds,
    ideal_seconds,
    litellm_config,
    litellm_limits,
    plan_agents,
    quick,
    rough_tokens,
    sim_flags,
    split_pick,
    stated_limits,
    text,
)
from bench.ratelimit_summary import (
    SECTION,
    TurnFacts,
    cell,
    measure,
    put_section,
    rank,
    section,
    summarise,
    table,
)
from luftpause.testkit.stack import Endpoint

ONE = (Provider(id="p0", rpm=100, tpm=10_000),)


def turn(ok: bool = True, provider: str = "p0", **kw: Any) -> TurnFacts:
    values: dict[str, Any] = {
        "latency_s": 1.0,
        "ttfb_s": 0.5,
        "prompt_tokens": 900,
        "completion_tokens": 100,
        "refused_seen": 0,
        "errors": 0,
    }
    return TurnFacts(ok=ok, provider=provider, **{**values, **kw})


def tally(refused: int = 0, billed: int = 0) -> dict[str, int]:
    return {"served": 10, "refused": refused, "billed_tokens": billed, "refused_tokens": 7}


def test_a_seed_gives_every_arm_the_same_agents_and_another_seed_other_ones() -> None:
    assert plan_agents(3, 16, Shape()) == plan_agents(3, 16, Shape())
    assert plan_agents(3, 16, Shape()) != plan_agents(4, 16, Shape())
    for plan in plan_agents(3, 16, Shape()):
        assert 1 <= len(plan.rounds) <= 3 and 300 <= plan.task_tokens <= 900
        assert plan.turns == len(plan.rounds) + 1


def test_text_has_the_simulators_four_characters_per_token() -> None:
    assert len(text("a", 250)) == 1000 and text("a", 250) == text("a", 250) != text("b", 250)


def test_the_ideal_is_the_charged_tokens_over_all_providers_rate() -> None:
    two = (Provider(id="a", tpm=30_000, rpm=100), Provider(id="b", tpm=10_000, rpm=100))
    charged = Charged(requests=50, input_tokens=90_000, output_tokens=10_000)
    assert ideal_seconds(charged, two, window_real_s=10.0) == pytest.approx(25.0)
    # Requests bind when they are the scarcer budget.
    assert ideal_seconds(Charged(requests=600), two, 10.0) == pytest.approx(30.0)


def test_a_budget_one_provider_lacks_binds_nothing() -> None:
    two = (Provider(id="a", tpm=1_000), Provider(id="b", rpm=10))
    assert ideal_seconds(Charged(requests=5, input_tokens=10**6), two, 10.0) == 0.0


def test_input_and_output_budgets_bind_on_their_own_tokens() -> None:
    anthropic = (Provider(id="a", itpm=10_000, otpm=500),)
    charged = Charged(requests=1, input_tokens=20_000, output_tokens=1_500)
    assert ideal_seconds(charged, anthropic, 6.0) == pytest.approx(18.0)


def test_budgets_start_whole_so_the_earliest_end_is_a_window_before_the_ideal() -> None:
    charged = Charged(input_tokens=25_000)
    assert earliest_seconds(charged, ONE, 10.0, "continuous") == pytest.approx(15.0)
    assert earliest_seconds(charged, ONE, 10.0, "fixed") == pytest.approx(20.0)
    assert earliest_seconds(Charged(input_tokens=5_000), ONE, 10.0, "fixed") == 0.0
    # Started 3 s into a fixed window, the next boundary is 7 s away.
    assert earliest_seconds(charged, ONE, 10.0, "fixed", phase_s=3.0) == pytest.approx(17.0)
    assert earliest_seconds(charged, ONE, 10.0, "continuous", phase_s=3.0) == pytest.approx(15.0)


def test_litellm_gets_the_limits_per_real_minute_the_endpoint_file_per_window() -> None:
    p = Provider(id="p0", rpm=120, tpm=60_000)
    assert litellm_limits(p, window_real_s=10.0) == {"rpm": 720, "tpm": 360_000}
    assert stated_limits(p, 10.0, "usage") == {
        "rpm": 120,
        "tpm": 60_000,
        "window_s": 10.0,
        "charges": "usage",
    }
    anthropic = Provider(id="p0", rpm=60, itpm=30_000, otpm=1_500)
    assert litellm_limits(anthropic, 60.0) == {"rpm": 60, "tpm": 30_000}


def test_litellm_gets_each_deployments_limits_and_its_routers_retries_and_cooldown() -> None:
    scenario = SCENARIOS["two-providers"]
    bases = ["http://127.0.0.1:9000/v1", "http://127.0.0.1:9001/v1"]
    config = litellm_config(scenario, bases, "sim")
    assert config["router_settings"] == {
        "routing_strategy": "usage-based-routing-v2",
        "num_retries": 3,
        "allowed_fails": 3,
        "cooldown_time": 30,
    }
    assert config["router_settings"] is not LITELLM_ROUTER  # a copy: the config is written out
    deployments = config["model_list"]
    assert {d["model_name"] for d in deployments} == {"sim"}
    params = [d["litellm_params"] for d in deployments]
    assert [p["api_base"] for p in params] == bases
    # Real time: the limits per window are the limits per minute.
    assert [(p["rpm"], p["tpm"]) for p in params] == [(30, 10_000), (30, 5_000)]
    assert all(p["model"] == "openai/sim" for p in params)


def test_the_direct_clients_have_the_openai_defaults_but_the_patient_one() -> None:
    assert client_retries("direct") == openai.DEFAULT_MAX_RETRIES == 2
    assert client_retries("direct-patient") == 30
    assert {client_retries(a) for a in ("litellm", "luftpause", "luftpause-limits")} == {2}
    with pytest.raises(ValueError, match="unknown arm"):
        client_retries("nginx")


def test_two_providers_split_the_turns_by_budget_not_alternately() -> None:
    weights = budget_weights(SCENARIOS["two-providers"].providers)
    assert weights == (10_000, 5_000)
    credit: tuple[float, ...] = (0.0, 0.0)
    picks = []
    for _ in range(30):
        chosen, credit = split_pick(credit, weights)
        picks.append(chosen)
    assert Counter(picks) == {0: 20, 1: 10}
    # Interleaved, never a block: each run of three turns has two for p0 and one for p1.
    assert all(sorted(picks[i : i + 3]) == [0, 0, 1] for i in range(0, 30, 3))
    split = BudgetSplit(weights)
    assert Counter(split.next() for _ in range(300)) == {0: 200, 1: 100}


def test_a_provider_with_input_and_output_budgets_splits_by_its_input_budget() -> None:
    anthropic = Provider(id="a", itpm=3_000, otpm=100)
    assert budget_weights((anthropic, Provider(id="b", tpm=1_000))) == (3_000, 1_000)
    assert budget_weights((Provider(id="c", rpm=7),)) == (7,)
    with pytest.raises(ValueError, match="one credit per weight"):
        split_pick((0.0,), (1, 2))


def test_luftpause_gets_the_endpoints_as_a_new_user_writes_them_or_with_empty_limits() -> None:
    scenario = SCENARIOS["fixed-openai"]
    ends = [Endpoint(id="p0", url="http://127.0.0.1:9000")]
    (bare,) = luftpause_endpoints(scenario, ends, "luftpause")
    assert bare.options == {} and "limits" not in bare.entry()
    (empty,) = luftpause_endpoints(scenario, ends, "luftpause-limits")
    assert empty.entry()["limits"] == {}  # rate-limited from the start, learned from headers
    (stated,) = luftpause_endpoints(scenario, ends, "luftpause-limits", stated=True)
    assert stated.options["limits"] == {
        "rpm": 30,
        "tpm": 15_000,
        "window_s": 60.0,
        "charges": "usage",
    }
    with pytest.raises(ValueError, match="no luftpause arm"):
        luftpause_endpoints(scenario, ends, "direct")


def test_every_arm_starts_at_the_same_point_of_a_fixed_window() -> None:
    # 3 s into a 60 s window (57 s left): wait 7 s to be 10 s in.
    assert align_wait_s(60.0, reset_s=57.0, phase_s=10.0) == pytest.approx(7.0)
    # 25 s in (35 s left), past the point: the next window's, 35 + 10 s away.
    assert align_wait_s(60.0, reset_s=35.0, phase_s=10.0) == pytest.approx(45.0)
    assert align_wait_s(60.0, reset_s=50.0, phase_s=10.0) == pytest.approx(0.0)


def test_the_default_scenarios_run_in_real_time_with_a_few_windows_of_work() -> None:
    for name in DEFAULT_SCENARIOS:
        s = SCENARIOS[name]
        assert (s.time_scale, s.window_real_s, s.stress) == (1.0, 60.0, False)
        for seed in (0, 1):
            tokens = sum(rough_tokens(p) for p in plan_agents(seed, s.agents, s.shape))
            rate = sum(p.limit("tpm") or p.limit("itpm") or 0 for p in s.providers)
            assert 1.0 < tokens / rate < 3.0, (name, seed, tokens / rate)
    for name in STRESS_SCENARIOS:
        assert SCENARIOS[name].stress and SCENARIOS[name].window_real_s == pytest.approx(10.0)
    assert set(DEFAULT_SCENARIOS).isdisjoint(STRESS_SCENARIOS)


def test_the_simulator_gets_the_scenarios_limits_regime_and_headers() -> None:
    s = SCENARIOS["continuous-anthropic"]
    flags = sim_flags(s, s.providers[0])
    assert {"--rpm=30", "--itpm=14000", "--otpm=800", "--time-scale"} <= set(flags)
    joined = " ".join(flags)
    assert "--rate-limit-regime continuous" in joined and "--rate-limit-headers anthropic" in joined


def test_quick_cuts_agents_and_budgets_in_proportion() -> None:
    q = quick(SCENARIOS["fixed-openai"], agents=4, time_scale=20.0)
    assert (q.agents, q.time_scale, q.window_real_s) == (4, 20.0, 3.0)
    assert q.providers[0].limits() == {"rpm": 15, "tpm": 7_500}


def test_arms_take_turns_going_first_and_the_defaults_run_them_all() -> None:
    assert [rotated(ARMS, i)[0] for i in range(6)] == [*ARMS, ARMS[0]]
    assert sorted(rotated(ARMS, 3)) == sorted(ARMS)
    args = parse_args([])
    assert args.arms == list(ARMS) and args.seeds == [0, 1]
    assert args.scenarios == list(DEFAULT_SCENARIOS) and args.out == "ratelimit_realtime"
    stress = parse_args(["--stress"])
    assert stress.scenarios == list(STRESS_SCENARIOS) and stress.out == "ratelimit_stress"


def test_quantiles_pick_by_rank() -> None:
    assert rank([], 0.5) is None and rank([3.0], 0.9) == 3.0
    values = [float(i) for i in range(1, 101)]
    assert (rank(values, 0.5), rank(values, 0.9), rank(values, 0.95)) == (51.0, 91.0, 96.0)


def test_an_arms_figures_come_from_its_turns_and_the_providers_tallies() -> None:
    failed = turn(ok=False, errors=2, refused_seen=3, error_kinds=("status 429",) * 2)
    turns = [turn(), turn(provider="p1"), failed]
    tallies = {"p0": tally(refused=4, billed=1000), "p1": tally(refused=1, billed=1000)}
    two = (Provider(id="p0", tpm=1_000), Provider(id="p1", tpm=1_000))
    m = measure(turns, tallies, wall_s=2.0, providers=two, window_real_s=2.0, regime="fixed")
    assert (m["turns_done"], m["turn_p50_s"], m["turn_p90_s"]) == (2, 1.0, 1.0)
    assert (m["provider_429s"], m["client_429s"], m["errors"]) == (5, 3, 2)
    assert m["error_kinds"] == {"status 429": 2}
    assert (m["billed_tokens"], m["refused_tokens"], m["turns_failed"]) == (2000, 14, 1)
    assert m["goodput_tps"] == 1000.0  # two completed turns of 1000 tokens in 2 s
    assert (m["ideal_s"], m["earliest_s"], m["wall_over_ideal"]) == (2.0, 0.0, 1.0)
    assert m["per_provider"]["p1"]["turn_share"] == 0.5


def test_seeds_summarise_to_a_median_and_a_range_per_arm() -> None:
    def seed(p429: int) -> dict[str, Any]:
        m = measure(
            [turn()], {"p0": tally(refused=p429)}, wall_s=1.0, providers=ONE, window_real_s=10.0,
            regime="continuous",
        )  # fmt: skip
        return {"luftpause": m, "direct": m}

    summary = summarise([seed(0), seed(4), seed(1), {"direct": {"failed": "TimeoutError: "}}])
    assert list(summary) == ["direct", "luftpause"]  # in the arms' order
    assert (summary["direct"]["seeds"], summary["direct"]["failed_runs"]) == (3, 1)
    assert summary["direct"]["provider_429s"] == {"median": 1, "min": 0, "max": 4}
    assert cell(summary["direct"]["provider_429s"], 0) == "1 (0..4)"
    assert cell(summary["direct"]["wall_s"], 1) == "1.0"
    assert cell(None, 2) == "-"


def test_the_table_has_a_row_per_arm_and_provider_shares_with_two_providers() -> None:
    two = (Provider(id="p0", tpm=1_000), Provider(id="p1", tpm=1_000))
    m = measure(
        [turn(), turn(provider="p1")], {"p0": tally(), "p1": tally(refused=2)}, wall_s=1.0,
        providers=two, window_real_s=1.0, regime="fixed",
    )  # fmt: skip
    rows = table({"two": {"summary": summarise([{"direct": m}])}}).splitlines()
    assert len(rows) == 3 and rows[2].startswith("| two | direct | 2 | 2 |")
    assert rows[2].endswith("| p0 0, 50%; p1 2, 50% |")


def test_the_results_section_is_replaced_in_place_or_appended() -> None:
    def result(*seeds: int) -> dict[str, Any]:
        entry = {"description": "`x`: one provider.", "seeds": [{"seed": s} for s in seeds]}
        machine = {"when": "2026-12-03T17:00:00Z", "commit": "0123456789abcdef"}
        return {"machine": machine, "scenarios": {"x": {**entry, "summary": {}}}}

    text_ = section(result(0))
    assert text_.startswith(SECTION) and "- `x`: one provider. Seeds 0." in text_
    assert "on commit 0123456789." in text_ and "`cooldown_time: 30`" in text_
    assert all(f"- `{arm}`: " in text_ for arm in ARMS)
    assert "Stress" in section(result(0), stress=result(1)) and "Stress" not in text_
    doc = "# Benchmark results\n\n## A\n\na\n"
    once = put_section(doc, text_)
    assert once.startswith(doc) and once.endswith(text_)
    between = "# R\n\n" + text_ + "\n## Later\n\nlater\n"
    again = put_section(between, section(result(0, 1)))
    assert again.count(SECTION) == 1 and "Seeds 0, 1." in again and again.endswith("later\n")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(
    importlib.util.find_spec("litellm") is None, reason="needs the bench extra (LiteLLM)"
)
async def test_the_quick_run_measures_every_arm_doing_the_same_work() -> None:
    result = await run(parse_args(["--quick", "--no-report"]), save=False)
    seeds = result["scenarios"]["fixed-openai"]["seeds"]
    arms = seeds[0]["arms"]
    assert sorted(arms) == sorted(ARMS)
    assert arms["litellm"]["front"]["router_settings"] == LITELLM_ROUTER
    assert "limits" not in arms["luftpause"]["front"]["endpoints"][0]
    assert all(a["load"]["seconds"] > 0 for a in arms.values())
    assert all(a["turns_failed"] == 0 and a["turns"] > 0 for a in arms.values())
    assert len({a["workload_tokens"] for a in arms.values()}) == 1
    assert all(a["wall_over_ideal"] > 0 for a in arms.values())


async def test_a_fill_runs_only_the_arms_a_seed_misses_or_that_failed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    ran: list[tuple[str, int]] = []

    async def fake_arm(scenario: Any, arm: str, seed: int, *_: Any) -> dict[str, Any]:
        ran.append((arm, seed))
        return {
            "turns_done": 1,
            "turns_failed": 0,
            "provider_429s": 0,
            "errors": 0,
            "per_provider": {},
        }

    monkeypatch.setattr(bench.ratelimit, "one_arm", fake_arm)
    done = {"turns_done": 1, "turns_failed": 0, "per_provider": {}}
    order = list(ARMS)
    entry: dict[str, Any] = {
        "seeds": [
            {
                "seed": 0,
                "order": order,
                "arms": {a: done for a in ARMS if a not in ("litellm", "luftpause")}
                | {"litellm": {"failed": "ChildFailed: not ready"}},
            }
        ]
    }
    saves: list[int] = []
    args = parse_args(["--fill", "--seeds", "0", "1", "--scenarios", "fixed-openai"])
    await bench.ratelimit.one_scenario(
        "fixed-openai", args, tmp_path, entry, lambda: saves.append(1)
    )
    assert ran[:2] == [("litellm", 0), ("luftpause", 0)]
    assert sorted(ran[2:]) == sorted((a, 1) for a in ARMS)  # a seed it lacked runs whole
    first = entry["seeds"][0]["arms"]
    assert "run_again" in first["litellm"] and "run_again" not in first["luftpause"]
    assert [s["seed"] for s in entry["seeds"]] == [0, 1] and len(saves) == 7
