"""The engine-family benchmark's verdicts: ratios, who is behind, the distribution (pure)."""

from __future__ import annotations

from typing import Any

from bench.family import ROUTER, behind, ratios, summarise


def arm(i: float, b: float, turns_i: float | None = None) -> dict[str, Any]:
    out = {"interactive": {"runs_per_min": i}, "batch": {"runs_per_min": b}}
    if turns_i is not None:
        out["interactive"]["turns_per_min"] = turns_i
        out["batch"]["turns_per_min"] = 4 * b
    return out


def model(name: str, ours: tuple[float, float], theirs: tuple[float, float]) -> dict[str, Any]:
    arms = {
        "luftpause": arm(*ours, turns_i=4 * ours[0]),
        ROUTER: arm(*theirs, turns_i=4 * theirs[0]),
    }
    return {
        "name": name,
        "arms": arms,
        "ratio": ratios(arms),
        "ratio_turns": ratios(arms, "turns_per_min"),
    }


def test_ratios_are_luftpause_over_the_router_per_class() -> None:
    m = model("a", (12.0, 90.0), (10.0, 100.0))
    assert m["ratio"] == {"interactive": 1.2, "batch": 0.9}
    assert m["ratio_turns"] == {"interactive": 1.2, "batch": 0.9}


def test_a_router_that_finished_nothing_gives_no_ratio() -> None:
    assert ratios({"luftpause": arm(1.0, 1.0), ROUTER: arm(0.0, 1.0)})["interactive"] is None


def test_behind_means_batch_short_by_more_than_a_tenth_or_short_on_both() -> None:
    assert behind({"interactive": 3.0, "batch": 0.89})
    assert not behind({"interactive": 3.0, "batch": 0.9})
    assert behind({"interactive": 0.99, "batch": 0.99})
    assert not behind({"interactive": 1.0, "batch": 0.95})
    assert not behind({"interactive": None, "batch": 0.5})


def test_the_summary_names_the_models_behind_and_the_worst() -> None:
    models = [
        model("even", (10.0, 100.0), (10.0, 100.0)),
        model("zero-sum", (40.0, 70.0), (10.0, 100.0)),
        model("both", (9.0, 95.0), (10.0, 100.0)),
    ]
    s = summarise(models)
    assert s["behind"] == ["zero-sum", "both"] and s["worst"] == "zero-sum"
    assert (s["batch"]["min"], s["batch"]["max"], s["models"]) == (0.7, 1.0, 3)
    assert summarise(models, "ratio_turns")["behind"] == ["zero-sum", "both"]
    assert summarise([], "ratio_turns") == {}


def test_only_keeps_the_named_models_with_the_tool_style_the_full_draw_gave_them() -> None:
    import argparse

    from bench.family import chosen_models

    a = argparse.Namespace(named=["issue-sglang"], models=30, sampler_seed=26, style=None, seed=1)
    full = {m.name: style for m, style in chosen_models(argparse.Namespace(**vars(a), only=None))}
    some = chosen_models(argparse.Namespace(**vars(a), only=["issue-sglang", "llamacpp-26-20"]))
    assert [(m.name, st) for m, st in some] == [
        ("issue-sglang", full["issue-sglang"]),
        ("llamacpp-26-20", full["llamacpp-26-20"]),
    ]


def run_at(seed: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    for r in rows:
        engine = {
            "admission": "sglang",
            "prefix_cache": "radix",
            "block_size": 1,
            "chunked_prefill": "off",
            "chunk_tokens": 4096,
            "kv_tokens": 96_000,
            "max_running": 48,
            "prefill_ms_per_token": 0.1,
        }
        r.update(family="f", style="openai", engine=engine, flags=[])
    return {"args": {"seed": seed}, "lab": True, "models": rows}


def test_pooling_seeds_averages_each_arm_and_keeps_every_seeds_own_ratio() -> None:
    from bench.family import pooled

    # One run fewer at seed 1 (behind on both there), one more at seed 2.
    runs = [
        run_at(1, [model("m", (9.0, 99.0), (10.0, 100.0))]),
        run_at(2, [model("m", (11.0, 101.0), (10.0, 100.0))]),
    ]
    out = pooled(runs)
    (m,) = out["models"]
    assert m["arms"]["luftpause"]["interactive"]["runs_per_min"] == 10.0
    assert m["ratio"] == {"interactive": 1.0, "batch": 1.0} and not behind(m["ratio"])
    assert m["by_seed"]["1"]["ratio"] == {"interactive": 0.9, "batch": 0.99}
    assert out["summary_by_seed"]["1"]["behind"] == ["m"] and out["summary"]["behind"] == []
    assert out["seeds"] == [1, 2]
    # Seed ratios 0.9 and 1.1 interactive: standard deviation 0.1414, over the root of 2.
    assert m["ratio_se"] == {"interactive": 0.1, "batch": 0.01}
    assert "1.0 / 1.0 ± 0.1 / 0.01 |" in out["table"]


def test_pooling_refuses_runs_of_different_draws() -> None:
    import pytest

    from bench.family import pooled

    runs = [
        run_at(1, [model("m", (9.0, 99.0), (10.0, 100.0))]),
        run_at(2, [model("other", (9.0, 99.0), (10.0, 100.0))]),
    ]
    with pytest.raises(ValueError, match="not in every run"):
        pooled(runs)


def test_a_style_seed_keeps_the_first_draws_styles_at_another_workload_seed() -> None:
    import argparse

    from bench.family import chosen_models

    base = dict(named=[], models=30, sampler_seed=26, style=None, only=None)
    first = chosen_models(argparse.Namespace(**base, seed=1))
    again = chosen_models(argparse.Namespace(**base, seed=2, style_seed=1))
    assert [(m.name, st) for m, st in first] == [(m.name, st) for m, st in again]


def test_a_model_behind_by_less_than_twice_its_seed_error_is_behind_but_within_noise() -> None:
    from bench.family import behind_beyond_noise

    hair: dict[str, float | None] = {"interactive": 0.985, "batch": 0.994}
    assert behind(hair)
    assert not behind_beyond_noise(hair, {"interactive": 0.01, "batch": 0.005})
    assert behind_beyond_noise(hair, {"interactive": 0.005, "batch": 0.002})
    # Short on batch by more than a tenth counts whatever the interactive ratio does.
    assert behind_beyond_noise(
        {"interactive": 1.5, "batch": 0.85}, {"interactive": 0.1, "batch": 0.01}
    )
    assert not behind_beyond_noise(
        {"interactive": 1.5, "batch": 0.89}, {"interactive": 0.1, "batch": 0.01}
    )
    assert not behind_beyond_noise(
        {"interactive": 1.01, "batch": 0.99}, {"interactive": 0.0, "batch": 0.0}
    )


def test_a_pooled_summary_names_the_models_behind_beyond_noise() -> None:
    from bench.family import pooled

    runs = [
        run_at(1, [model("m", (9.9, 99.0), (10.0, 100.0)), model("n", (9.0, 90.0), (10.0, 100.0))]),
        run_at(
            2, [model("m", (9.5, 100.0), (10.0, 100.0)), model("n", (9.1, 91.0), (10.0, 100.0))]
        ),
    ]
    summary = pooled(runs)["summary"]
    assert summary["behind"] == ["m", "n"] and summary["behind_beyond_noise"] == ["n"]
