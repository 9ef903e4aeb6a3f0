"""The `share` rule (`core.shares`): interactive first, up to a weighted share of the pool."""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client import generate_latest

from luftpause.common.config import Endpoint
from luftpause.scheduler.core.decide import decide
from luftpause.scheduler.core.events import Admit, Place, ProbeResult, TurnFinished
from luftpause.scheduler.core.model import INTERACTIVE_WEIGHT, Rules, ServiceClass
from luftpause.scheduler.core.state import State
from luftpause.scheduler.core.status import status_view
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.main import parse_args, rules_from
from tests.scheduler.helpers import MODEL, admit, cap, finish, placed, pool

BATCH = ServiceClass.BATCH
STRICT = Rules().switched(["share"], on=False)


def _busy_then_held(rules: Rules, *, batch_first_s: float = 0.0) -> State:
    """One slot: a batch turn for `batch_first_s`, then an interactive one until 10 s; then a
    batch and an interactive turn (other runs) wait for it."""
    state = cap(pool("a", rules=rules), "a", 1)
    at = 0.0
    if batch_first_s:
        state, _ = admit(state, "b0", "rb0", cls=BATCH, at=0.0)
        state, _ = finish(state, "b0", at=batch_first_s)
        at = batch_first_s
    state, _ = admit(state, "i0", "ri0", at=at)
    state, _ = admit(state, "b1", "rb1", cls=BATCH, at=at + 0.5)
    state, _ = admit(state, "i1", "ri1", at=at + 1.0)
    return state


def test_interactive_past_its_share_lets_a_batch_turn_go_first() -> None:
    # Interactive had all of the last 10 s; with one run of each class wanting the pool its
    # share is w / (w + 1), 3/5 at the default weight.
    _, actions = finish(_busy_then_held(Rules()), "i0", at=10.0)
    assert placed(actions) == {"b1": "a"}


def test_with_the_share_rule_off_interactive_always_goes_first() -> None:
    _, actions = finish(_busy_then_held(STRICT), "i0", at=10.0)
    assert placed(actions) == {"i1": "a"}


@pytest.mark.parametrize(("weight", "first"), [(2.0, "b1"), (4.0, "i1")])
def test_the_weight_sets_the_share(weight: float, first: str) -> None:
    # Batch 0-2 s, interactive 2-10 s: interactive had 81 % of the pool's time (7.5 of 9.2
    # faded turn-seconds), 1.3 beyond a share of 2/3 (weight 2), 0.1 beyond 4/5 (weight 4):
    # within the one turn-second of slack.
    state = _busy_then_held(Rules(interactive_weight=weight), batch_first_s=2.0)
    _, actions = finish(state, "i0", at=10.0)
    assert placed(actions) == {first: "a"}


def test_after_a_quiet_spell_interactive_goes_first_again() -> None:
    state = _busy_then_held(Rules())
    state, actions = finish(state, "i0", at=10.0)
    assert placed(actions) == {"b1": "a"}
    # b1 runs for one second, then the pool is quiet for ten minutes: what interactive had
    # beyond its share faded with it.
    state, _ = finish(state, "b1", at=11.0)  # i1 goes: nothing else waits
    state, _ = admit(state, "b2", "rb2", cls=BATCH, at=11.5)
    state, _ = finish(state, "i1", at=12.0)  # b2 goes
    state, _ = admit(state, "b3", "rb3", cls=BATCH, at=600.0)
    state, _ = admit(state, "i2", "ri2", at=600.5)
    _, actions = finish(state, "b2", at=601.0)
    assert placed(actions) == {"i2": "a"}


def test_interactive_past_its_share_takes_what_no_batch_turn_can_use() -> None:
    state = cap(pool("a"), "a", 1)
    state, _ = admit(state, "i0", "ri0", at=0.0)
    state, _ = admit(state, "i1", "ri1", at=1.0)
    # No batch turn waits: the pool is interactive's, however much it had.
    _, actions = finish(state, "i0", at=30.0)
    assert placed(actions) == {"i1": "a"}


def _saturated(rules: Rules, interactive: int, batch: int, slots: int, seconds: int) -> Counter:
    """A pool of `slots` slots and closed-loop runs whose turns each take a second and come
    back at once: the turn-seconds each class had."""
    state = cap(pool("a", rules=rules), "a", slots)
    runs = [f"i{n}" for n in range(interactive)] + [f"b{n}" for n in range(batch)]
    run_of: dict[str, str] = {}
    in_flight: set[str] = set()
    had: Counter = Counter()
    serial = 0

    def send(run: str, at: float) -> None:
        nonlocal state, serial
        serial += 1
        tid = f"{run}-{serial}"
        run_of[tid] = run
        cls = BATCH if run.startswith("b") else ServiceClass.INTERACTIVE
        state, actions = decide(
            state, Admit(at=at, turn_id=tid, run_id=run, model=MODEL, service_class=cls)
        )
        in_flight.update(a.turn_id for a in actions if isinstance(a, Place))

    for run in runs:
        send(run, 0.0)
    for second in range(1, seconds + 1):
        for tid in sorted(in_flight):
            in_flight.discard(tid)
            had[run_of[tid][0]] += 1
            state, actions = decide(state, TurnFinished(at=float(second), turn_id=tid))
            in_flight.update(a.turn_id for a in actions if isinstance(a, Place))
            send(run_of[tid], float(second))
    return had


def test_a_saturated_pool_gives_interactive_its_weighted_share_and_batch_the_rest() -> None:
    # Three interactive and six batch runs on two slots: each interactive run weighs two batch
    # runs, so interactive's share is 6 / (6 + 6); in arrival order it would have 3 / 9.
    had = _saturated(Rules(interactive_weight=2.0), interactive=3, batch=6, slots=2, seconds=300)
    part = had["i"] / (had["i"] + had["b"])
    assert 0.42 <= part <= 0.58, had
    # Strict priority: an interactive turn always waits when a slot frees; batch never runs.
    strict = _saturated(STRICT, interactive=3, batch=6, slots=2, seconds=300)
    assert strict["b"] == 0 and strict["i"] == 600, strict


def test_status_shows_each_pools_share() -> None:
    state, _ = finish(_busy_then_held(Rules()), "i0", at=10.0)
    view = status_view(state, now=10.0)
    assert view["interactive_weight"] == INTERACTIVE_WEIGHT
    share = view["shares"][MODEL]
    assert share["interactive_part"] == 1.0
    assert share["past_share"] is True and share["interactive_owed_s"] > 1.0


@pytest.mark.parametrize("weight", [0.0, -1.0, float("inf"), float("nan")])
def test_a_weight_that_is_not_a_positive_number_is_refused(weight: float) -> None:
    with pytest.raises(ValueError, match="positive number"):
        Rules(interactive_weight=weight)


def test_the_scheduler_exports_each_pools_share() -> None:
    now = [0.0]
    host = SchedulerHost(
        [Endpoint(id="a", url="http://a:1", models=frozenset({MODEL}))], clock=lambda: now[0]
    )
    host.apply(ProbeResult(at=0.0, replica_id="a", healthy=True, running=1, waiting=1))
    host.apply(Admit(at=0.0, turn_id="i0", run_id="ri0", model=MODEL))
    host.apply(Admit(at=1.0, turn_id="b1", run_id="rb1", model=MODEL, service_class=BATCH))
    now[0] = 10.0
    page = generate_latest(host.metrics.registry).decode()
    assert f'luftpause_interactive_part{{model="{MODEL}"}} 1.0' in page
    owed = [line for line in page.splitlines() if line.startswith("luftpause_interactive_owed")]
    assert len(owed) == 1 and float(owed[0].split()[-1]) > 1.0


def test_the_interactive_weight_is_an_option_and_a_bad_one_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert rules_from(parse_args(["--interactive-weight", "3"], {})).interactive_weight == 3.0
    env = {"LUFTPAUSE_INTERACTIVE_WEIGHT": "2.5"}
    assert rules_from(parse_args([], env)).interactive_weight == 2.5
    rules = rules_from(parse_args(["--without", "share"], {}))
    assert not rules.share and rules.interactive_weight == INTERACTIVE_WEIGHT
    for bad in ("0", "-1", "inf", "lots"):
        with pytest.raises(SystemExit):
            parse_args(["--interactive-weight", bad], {})
        assert "not a positive number" in capsys.readouterr().err
