"""The forecast's arithmetic (`forecast`, `turn_estimates`): pure, no event loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from luftpause.runtime.core.forecast import BudgetLine, Inputs, Step, project
from luftpause.runtime.core.price import Price
from luftpause.runtime.core.rate_waits import Dimension, Window
from luftpause.runtime.core.turn_estimates import blend, seconds, turn_seconds
from luftpause.runtime.core.turn_samples import (
    History,
    ModelStats,
    RoundSample,
    Spread,
    TurnSample,
)

PRICE = Price(input=1.0, cached_input=0.5, output=2.0)


def turn(prompt: int, completion: int = 10, seconds: float = 1.0, **kw: object) -> TurnSample:
    return TurnSample(prompt=prompt, cached=0, completion=completion, seconds=seconds, **kw)  # type: ignore[arg-type]


def steady(turns: int = 2, growth: int = 100) -> History:
    """A run whose prompt grew by `growth` a round, each turn 1 s, each round 0.5 s."""
    return History(
        turns=tuple(turn(500 + growth * k) for k in range(turns)),
        rounds=tuple(RoundSample(calls=1, seconds=0.5) for _ in range(turns)),
    )


ANSWERS = ModelStats(
    answer_completion=Spread(n=5, mean=60.0, sd=0.0),
    answer_seconds=Spread(n=5, mean=3.0, sd=0.0),
)


def test_the_rest_of_the_tool_calls_is_one_step_a_call_then_the_answer() -> None:
    f = project(Inputs(history=steady(), prior=ANSWERS, calls_left=3, max_tokens=256))
    assert [s.kind for s in f.steps] == ["call", "call", "call", "answer"]
    assert [s.prompt for s in f.steps] == [700, 800, 900, 1000]
    assert [s.completion for s in f.steps] == [10, 10, 10, 60]
    assert [s.turn_seconds for s in f.steps] == [1.0, 1.0, 1.0, 3.0]
    assert [s.tool_seconds for s in f.steps] == [0.5, 0.5, 0.5, 0.0]
    assert f.until == "answer" and f.first is None


def test_steps_cut_the_horizon_and_never_reach_past_the_answer() -> None:
    cut = project(Inputs(history=steady(), calls_left=3, steps=2))
    assert len(cut.steps) == 2 and cut.until == "steps"
    whole = project(Inputs(history=steady(), calls_left=3, steps=99))
    assert len(whole.steps) == 4 and whole.until == "answer"
    with pytest.raises(ValueError, match="steps must be at least 1"):
        Inputs(history=steady(), steps=0)


def test_a_round_in_progress_ends_before_the_next_turn() -> None:
    f = project(Inputs(history=steady(), calls_left=1, in_round=True))
    assert [s.kind for s in f.steps] == ["call", "answer"]
    assert f.steps[0].tool_seconds == 1.0  # the round running now and its own


def test_parallel_calls_take_fewer_rounds() -> None:
    history = History(turns=(turn(500),), rounds=(RoundSample(calls=3, seconds=1.0),))
    f = project(Inputs(history=history, calls_left=6, parallel=True))
    assert [s.calls for s in f.steps] == [3.0, 3.0, 0.0]


def test_the_models_samples_count_as_two_of_the_runs_own() -> None:
    found = blend([10.0], Spread(n=100, mean=40.0, sd=0.0))
    assert found is not None and found.mean == pytest.approx(30.0)
    assert blend([], Spread()) is None
    assert blend([], Spread(n=3, mean=5.0, sd=1.0)) == Spread(n=3, mean=5.0, sd=1.0)


def test_without_an_answer_seen_the_answer_counts_at_max_tokens_and_takes_a_calls_seconds() -> None:
    f = project(Inputs(history=steady(), calls_left=0, max_tokens=256))
    [answer] = f.steps
    assert (answer.kind, answer.completion, answer.turn_seconds) == ("answer", 256, 1.0)
    assert f.sources["answerSeconds"] == "other kind"
    assert any("maxTokens" in n for n in f.notes)


def test_a_run_of_a_model_never_seen_has_tokens_from_its_text_and_no_seconds() -> None:
    f = project(Inputs(history=History(), calls_left=1, prompt_guess=300, results_tokens=40))
    assert f.steps[0].prompt == 300 and f.seconds_sd is None
    assert f.sources["callSeconds"] == "unknown"
    assert f.steps[1].prompt == 300 + 256 + 40  # growth: a (maxTokens) reply and the results


def test_turn_seconds_predicts_the_answer_from_answers_and_falls_back_to_calls() -> None:
    assert turn_seconds(steady(), ANSWERS, answer=True) == 3.0
    assert turn_seconds(steady(), ModelStats(), answer=True) == 1.0
    assert turn_seconds(History(), ModelStats(), answer=False) is None


def test_each_budget_is_met_at_the_first_step_past_it() -> None:
    budgets = (
        BudgetLine(run="p", limits={"tokens": 1500}, used={"tokens": 100}),
        BudgetLine(
            run="r", limits={"toolCalls": 4, "seconds": 6.0}, used={"toolCalls": 2, "seconds": 2.0}
        ),
        BudgetLine(run="q", limits={"usd": 0.0025}, used={"usd": 0.0005}),
    )
    f = project(Inputs(history=steady(), prior=ANSWERS, calls_left=3, budgets=budgets, price=PRICE))
    hits = {(h.which, h.run): h.at_step for h in f.hits}
    # tokens: 100 + 710 + 810 > 1500 at step 2; toolCalls: 2 + 3 > 4 at step 3;
    # seconds: 2 + 1.5 + 1.5 + 1.5 > 6 at step 3; usd: 0.0005 + 0.00072 + 0.00082 + 0.00092 >
    # 0.0025 at step 3
    assert hits == {
        ("tokens", "p"): 2,
        ("toolCalls", "r"): 3,
        ("seconds", "r"): 3,
        ("usd", "q"): 3,
    }
    assert f.first is not None and (f.first.which, f.first.at_step) == ("tokens", 2)


def test_the_context_wall_is_the_first_prompt_that_leaves_no_room_for_max_tokens() -> None:
    f = project(Inputs(history=steady(), calls_left=5, max_tokens=256, context_window=1200))
    [hit] = f.hits
    assert (hit.which, hit.at_step, hit.projected) == ("context", 4, 1000 + 256)


def test_waits_of_a_tight_window_add_to_the_seconds() -> None:
    dims = (Dimension(name="tokens", limit=2000, available=800, refill_s=30.0),)
    f = project(Inputs(history=steady(), calls_left=2, windows=(Window(id="w", dimensions=dims),)))
    assert [s.wait_seconds for s in f.steps] == [0.0, 28.5, 0.0]


def tokens(steps: tuple[Step, ...]) -> float:
    return sum(s.prompt + s.completion for s in steps)


@given(
    prompts=st.lists(st.integers(1, 5000), min_size=1, max_size=6),
    completion=st.integers(0, 300),
    calls_left=st.integers(0, 12),
    steps=st.none() | st.integers(1, 20),
    seconds=st.floats(0.0, 30.0),
)
def test_a_forecast_is_a_sane_projection(
    prompts: list[int], completion: int, calls_left: int, steps: int | None, seconds: float
) -> None:
    """Invariants: as many steps as asked (or the calls left plus the answer), only the last
    may be the answer, every quantity is >= 0, a prompt never shrinks below the last one (a
    history only grows), and a longer horizon never costs fewer tokens."""
    history = History(
        turns=tuple(turn(p, completion, seconds) for p in prompts),
        rounds=tuple(RoundSample(calls=1, seconds=seconds) for _ in prompts),
    )
    given_ = Inputs(history=history, calls_left=calls_left, steps=steps, price=PRICE)
    f = project(given_)
    horizon = calls_left + 1
    assert len(f.steps) == (horizon if steps is None else min(steps, horizon))
    assert all(s.kind == "call" for s in f.steps[:-1])
    assert f.steps[-1].kind == ("answer" if len(f.steps) == horizon else "call")
    assert all(s.completion >= 0 and s.turn_seconds >= 0 and (s.usd or 0) >= 0 for s in f.steps)
    assert f.tokens_sd >= 0 and (f.seconds_sd or 0) >= 0
    assert all(s.prompt >= prompts[-1] for s in f.steps)
    shorter = project(Inputs(history=history, calls_left=calls_left, price=PRICE))
    longer = project(Inputs(history=history, calls_left=calls_left + 1, price=PRICE))
    assert tokens(longer.steps) >= tokens(shorter.steps)


@given(limit=st.integers(0, 20000), used=st.integers(0, 5000))
def test_a_budget_hit_is_the_first_step_past_the_limit(limit: int, used: int) -> None:
    """Invariant: at the step a hit names the use is past the limit, and the step before is not."""
    line = BudgetLine(run="p", limits={"tokens": limit}, used={"tokens": used})
    f = project(Inputs(history=steady(), calls_left=6, budgets=(line,)))
    running, crossed = float(used), None
    for s in f.steps:
        running += s.prompt + s.completion
        if running > limit:
            crossed = s.number
            break
    assert [h.at_step for h in f.hits] == ([] if crossed is None else [crossed])


def test_a_first_turn_reads_its_whole_prompt_so_later_turns_are_predicted_from_later_ones() -> None:
    history = History(turns=(turn(500, seconds=5.0), turn(600, seconds=1.0)))
    assert turn_seconds(history, ModelStats(), answer=False) == 1.0
    only_first = History(turns=(turn(500, seconds=5.0),))
    found = seconds(only_first, ModelStats(), answer=False)
    assert found is not None and (found.mean, found.source) == (5.0, "first turn")
    prior = ModelStats(
        first_seconds=Spread(n=4, mean=5.0, sd=0.0), call_seconds=Spread(n=4, mean=1.0, sd=0.0)
    )
    f = project(Inputs(history=History(), prior=prior, calls_left=2, prompt_guess=100))
    assert [s.turn_seconds for s in f.steps] == [5.0, 1.0, 1.0]
    assert turn_seconds(History(), prior, answer=False) == 5.0
