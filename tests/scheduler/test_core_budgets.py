"""The decision core's admission by rate-limit budget (`core.gate`, `core.windows`)."""

from __future__ import annotations

import pytest

from luftpause.common.config import Endpoint
from luftpause.common.limits import Limits
from luftpause.common.ratelimits import Budget, Reading
from luftpause.scheduler.core import readings
from luftpause.scheduler.core import windows as w
from luftpause.scheduler.core.decide import decide, initial_state
from luftpause.scheduler.core.events import (
    Action,
    Admit,
    ProbeResult,
    Reject,
    Tick,
    TurnAbandoned,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from luftpause.scheduler.core.model import KeyLimits, ServiceClass
from luftpause.scheduler.core.placement import open_replicas
from luftpause.scheduler.core.state import State
from luftpause.scheduler.core.status import status_view
from tests.scheduler.helpers import IDLE, MODEL, endpoint, placed

# 400 body bytes are 100 prompt tokens (0.25 tokens per byte before any usage); a reply asked
# for 100 tokens at most: 200 tokens a turn, one request.
BODY = 400
REPLY = 100


def hosted(rid: str, limits: Limits | None = None) -> Endpoint:
    return Endpoint(
        id=rid, url=f"http://{rid}:1", models=frozenset({MODEL}), limits=limits or Limits()
    )


def start(*endpoints: Endpoint) -> State:
    """The endpoints probed: a hosted one (with `limits`) reports no engine load, the others
    report an idle engine's."""
    state = initial_state(endpoints)
    for e in endpoints:
        load = IDLE if e.limits is None else {}
        state, _ = decide(state, ProbeResult(at=0.0, replica_id=e.id, healthy=True, **load))
    return state


def ask(
    state: State,
    turn: str,
    *,
    at: float,
    run: str = "",
    caller: str = "",
    key: KeyLimits | None = None,
    body: int = BODY,
    cls: ServiceClass = ServiceClass.INTERACTIVE,
    wall_at: float = 0.0,
) -> tuple[State, tuple[Action, ...]]:
    return decide(
        state,
        Admit(
            at=at,
            turn_id=turn,
            run_id=run or f"run-{turn}",
            model=MODEL,
            service_class=cls,
            caller=caller,
            prompt_bytes=body,
            max_tokens=REPLY,
            key=key,
            wall_at=wall_at,
        ),
    )


def done(
    state: State,
    turn: str,
    *,
    at: float,
    prompt: int = 100,
    completion: int = 100,
    reading: Reading | None = None,
    read_at: float | None = None,
) -> tuple[State, tuple[Action, ...]]:
    return decide(
        state,
        TurnFinished(
            at=at,
            turn_id=turn,
            prompt_tokens=prompt,
            completion_tokens=completion,
            reading=reading,
            reading_at=at if read_at is None else read_at,
        ),
    )


def tokens_left(remaining: int, reset_s: float, limit: int = 1000) -> Reading:
    return Reading(budgets={"tokens": Budget(limit=limit, remaining=remaining, reset_s=reset_s)})


def test_a_stated_window_admits_what_fits_and_holds_the_rest_until_it_refills() -> None:
    state = start(hosted("api", Limits(tpm=500)))
    state, first = ask(state, "t1", at=1.0)
    state, second = ask(state, "t2", at=1.0)
    state, third = ask(state, "t3", at=1.0)
    assert placed(first) == {"t1": "api"} and placed(second) == {"t2": "api"}
    assert third == () and "t3" in state.budget_held
    # 400 reserved of a full 500-token bucket: 100 left, t3 needs 200. Charged 400 at 2 s, the
    # bucket refills 500 a minute: t3 fits 12 s later.
    state, _ = done(state, "t1", at=2.0)
    state, _ = done(state, "t2", at=2.0)
    assert "t3" in state.budget_held and state.wake_at == pytest.approx(14.0)
    state, woken = decide(state, Tick(at=state.wake_at))
    assert placed(woken) == {"t3": "api"} and not state.budget_held and state.wake_at == -1.0


def test_a_turn_bigger_than_the_whole_window_is_refused_at_once_with_why() -> None:
    state = start(hosted("api", Limits(tpm=500)))
    state, actions = ask(state, "big", at=1.0, body=4000)  # 1000 prompt tokens
    (reject,) = actions
    assert isinstance(reject, Reject) and reject.code == "rate_limited"
    assert reject.retry_after_s == 60.0 and "whole window is 500 per minute" in reject.message
    assert not state.budget_held and not state.turns
    assert status_view(state, 1.0)["budgets"][0]["refused"] == 1


def test_a_rate_limited_replica_is_never_open_to_the_dataplanes() -> None:
    state = start(hosted("api", Limits(tpm=600)), endpoint("local"))
    assert [r.id for r in open_replicas(state)] == ["local"]


def test_a_reading_replaces_the_level_and_counts_the_turns_started_before_it() -> None:
    state = start(hosted("api"))  # no stated limits: learned from the first reply
    state, first = ask(state, "t1", at=1.0)
    state, second = ask(state, "t2", at=1.0)
    assert placed(first) == {"t1": "api"} and second == ()  # one at a time until read
    state, _ = decide(state, TurnStarted(at=1.1, turn_id="t1"))
    state, after = done(state, "t1", at=3.0, reading=tokens_left(700, 30.0), read_at=1.2)
    assert placed(after) == {"t2": "api"}
    window = state.windows["api"]
    assert window.levels["tokens"].base == 700 and window.read_at == 1.2
    assert window.uncounted == (1, 200, 100, 100)  # t2, not counted by t1's reading


def test_an_unknown_regime_waits_for_the_reset_and_then_has_the_whole_limit() -> None:
    state = start(hosted("api"))
    state, _ = ask(state, "t1", at=1.0)
    state, _ = decide(state, TurnStarted(at=1.0, turn_id="t1"))
    state, _ = done(state, "t1", at=1.5, reading=tokens_left(100, 10.0), read_at=1.0)
    state, held = ask(state, "t2", at=2.0)
    assert held == () and state.wake_at == pytest.approx(11.0)
    state, woken = decide(state, Tick(at=11.0))
    assert placed(woken) == {"t2": "api"}
    assert w.available(state.windows["api"], "tokens", 11.0) == 1000 - 200


def test_readings_teach_the_regime() -> None:
    fixed = w.Window(id="a")
    bucket = w.Window(id="b")
    for i in range(5):
        used = 100 + 100 * i
        # A fixed window: the reset runs down with the clock, whatever was used.
        left = 1000 - used
        fixed = readings.observe(fixed, tokens_left(left, 60.0 - i), float(i), refused=False)
        # A bucket of 1000 a minute: its reset is always used / 1000 minutes.
        bucket = readings.observe(
            bucket, tokens_left(1000 - used, used * 0.06), float(i), refused=False
        )
    assert fixed.regime is w.Regime.FIXED and bucket.regime is w.Regime.CONTINUOUS


def test_a_429_cools_the_window_down_raises_k_and_the_turn_goes_to_the_other_provider() -> None:
    state = start(hosted("a", Limits(tpm=10_000)), hosted("b", Limits(tpm=10_000)))
    state, first = ask(state, "t1", at=1.0, run="r")
    home = placed(first)["t1"]
    state, _ = decide(state, TurnStarted(at=1.0, turn_id="t1"))
    refusal = Reading(retry_after_s=20.0)
    state, _ = decide(
        state, TurnFailed(at=1.1, turn_id="t1", reading=refusal, reading_at=1.1, refused=True)
    )
    window = state.windows[home]
    assert window.cooldown_until == pytest.approx(21.1) and window.caution.k == w.K_START + w.K_UP
    assert window.provider_429s == 1
    state, again = ask(state, "t2", at=1.2, run="r")
    other = "b" if home == "a" else "a"
    assert placed(again) == {"t2": other}


def test_with_two_providers_turns_go_to_the_one_with_headroom_before_either_refuses() -> None:
    state = start(hosted("a", Limits(tpm=1000)), hosted("b", Limits(tpm=1000)))
    where: list[str] = []
    for i in range(10):
        state, actions = ask(state, f"t{i}", at=1.0)
        where += placed(actions).values()
    assert sorted(where) == ["a"] * 5 + ["b"] * 5 and len(state.budget_held) == 0
    state, actions = ask(state, "t10", at=1.0)
    assert actions == () and "t10" in state.budget_held


def test_a_caller_over_its_key_budget_is_held_while_another_callers_turns_go_on() -> None:
    state = start(endpoint("local"))
    small = KeyLimits(name="team-a", tokens_per_minute=300)
    state, first = ask(state, "a1", at=1.0, caller="team-a/x", key=small)
    state, second = ask(state, "a2", at=1.0, caller="team-a/y", key=small)
    state, other = ask(state, "b1", at=1.0, caller="team-b")
    assert placed(first) == {"a1": "local"} and second == () and placed(other) == {"b1": "local"}
    assert "a2" in state.budget_held
    view = {b["id"]: b for b in status_view(state, 1.0)["budgets"]}["key:team-a"]
    assert view["kind"] == "key" and view["held"] == 1
    # a1 ends having spent 120 of 300 (5 a second back): a2 (200) fits 4 s later.
    state, after = done(state, "a1", at=2.0, prompt=100, completion=20)
    assert after == () and state.wake_at == pytest.approx(6.0)
    state, woken = decide(state, Tick(at=6.0))
    assert placed(woken) == {"a2": "local"}


def test_a_key_past_its_daily_quota_is_refused_until_midnight() -> None:
    state = start(endpoint("local"))
    key = KeyLimits(name="team-a", daily_tokens=300)
    noon = 20_000 * 86400.0 + 43_200.0
    state, first = ask(state, "a1", at=1.0, key=key, wall_at=noon)
    state, _ = done(state, "a1", at=2.0, prompt=150, completion=100)
    state, second = ask(state, "a2", at=3.0, key=key, wall_at=noon + 1)
    assert placed(first) == {"a1": "local"}
    (reject,) = second
    assert isinstance(reject, Reject) and reject.code == "rate_limited"
    assert reject.retry_after_s == pytest.approx(43_199.0) and "250 of its 300" in reject.message


def test_a_held_turn_whose_client_left_is_dropped_with_its_reservation() -> None:
    state = start(hosted("api", Limits(tpm=300)))
    state, _ = ask(state, "t1", at=1.0)
    state, held = ask(state, "t2", at=1.0)
    assert held == () and "t2" in state.budget_held
    state, _ = decide(state, TurnAbandoned(at=1.5, turn_id="t2"))
    assert not state.budget_held and set(state.windows["api"].pending) == {"t1"}


def test_interactive_turns_held_for_a_window_go_before_batch_ones() -> None:
    state = start(hosted("api", Limits(rpm=1)))
    state, _ = ask(state, "t0", at=1.0)
    state, _ = ask(state, "batch", at=1.0, cls=ServiceClass.BATCH)
    state, _ = ask(state, "inter", at=1.1)
    state, _ = done(state, "t0", at=1.5)
    state, woken = decide(state, Tick(at=state.wake_at))
    assert placed(woken) == {"inter": "api"}


def test_a_reply_teaches_the_prediction_per_model_and_caller() -> None:
    state = start(hosted("api", Limits(tpm=100_000)))
    for i in range(4):
        state, _ = ask(state, f"t{i}", at=1.0 + i, caller="team-a/x")
        state, _ = done(state, f"t{i}", at=1.5 + i, completion=10)
    replies = state.replies[(MODEL, "team-a")]
    assert replies.n == 4 and replies.predict(1.0) == pytest.approx(10.0)


def test_a_providers_window_reserves_a_requests_max_tokens_as_hosted_apis_count_it() -> None:
    # OpenAI and Anthropic count max_tokens up front: whatever the replies were so far, a turn
    # reserves its whole max_tokens (100), and a window needs that much room to admit it.
    state = start(hosted("api", Limits(otpm=250)))
    for i in range(5):
        state, _ = ask(state, f"t{i}", at=1.0 + 100 * i, caller="team-a/x")
        state, _ = done(state, f"t{i}", at=1.5 + 100 * i, completion=10)
    state, _ = ask(state, "a", at=600.0, caller="team-a/x")
    state, _ = ask(state, "b", at=600.0, caller="team-a/x")
    state, _ = ask(state, "c", at=600.0, caller="team-a/x")
    window = state.windows["api"]
    assert {t: p.cost[3] for t, p in window.pending.items()} == {"a": 100, "b": 100}
    assert set(state.budget_held) == {"c"}


def test_a_usage_charged_window_reserves_the_long_replies_of_a_mix_of_short_and_long() -> None:
    # An agent's turns: nine short tool calls to one long answer. mean + 2 sigma of that mix
    # falls short of every answer; a provider charging the reply as it starts would refuse a
    # turn admitted on it. Its window reserves the longest reply seen lately.
    state = start(hosted("api", Limits(otpm=100_000, charges="usage")))
    for i in range(45):
        state, _ = ask(state, f"t{i}", at=1.0 + i, caller="team-a/x")
        state, _ = done(state, f"t{i}", at=1.5 + i, completion=90 if i % 10 == 9 else 10)
    replies = state.replies[(MODEL, "team-a")]
    seen = replies.predict(2.0)
    assert seen is not None and seen < 75
    assert replies.bound(2.0, prior=256) == pytest.approx(90.0, abs=1.0)
    state, _ = ask(state, "next", at=50.0, caller="team-a/x")
    assert state.windows["api"].pending["next"].cost[3] in range(89, 100)
    # One long reply fades: forty short ones later the bound is back near the mix's own.
    faded = replies.add(400.0)
    for _ in range(40):
        faded = faded.add(10.0)
    assert faded.bound(2.0, prior=256) < 60


def test_a_usage_charged_window_reserves_the_prior_while_only_short_replies_were_seen() -> None:
    # An agent's first turns are its tool calls: five short replies do not yet say that no
    # long one comes, so the reservation stays near the prior (capped by max_tokens, 100).
    state = start(hosted("api", Limits(otpm=100_000, charges="usage")))
    for i in range(5):
        state, _ = ask(state, f"t{i}", at=1.0 + i, caller="team-a/x")
        state, _ = done(state, f"t{i}", at=1.5 + i, completion=10)
    state, _ = ask(state, "next", at=10.0, caller="team-a/x")
    assert state.windows["api"].pending["next"].cost[3] == REPLY


def test_readings_out_of_order_keep_the_lowest_count_and_the_safe_reset() -> None:
    """Two requests sent at once: the provider admitted B before A, but A's reply came first.
    B's higher count does not undo A's. Of their reset times the later stands while the regime
    is unknown (a bucket's full time moves later with every charge), the earlier once the
    window is known to be fixed (each reading's is late by its latency)."""
    for regime, full_at in ((w.Regime.UNKNOWN, 11.6), (w.Regime.FIXED, 11.4)):
        window = w.Window(id="api", refill=w.Refill(regime=regime))
        window = readings.observe(
            window, tokens_left(200, 10.3), 1.3, refused=False
        )  # A, slow reply
        window = readings.observe(window, tokens_left(300, 10.0), 1.4, refused=False)  # B
        level = window.levels["tokens"]
        assert level.base == 200 and level.full_at == pytest.approx(full_at)
    # A reading of the next window (a reset a period later) starts it afresh.
    window = readings.observe(window, tokens_left(900, 60.0), 12.0, refused=False)
    assert window.levels["tokens"].base == 900 and window.levels["tokens"].full_at == 72.0


def test_readings_moments_apart_with_nothing_used_between_cast_no_vote() -> None:
    """A fixed window's reset and a bucket's say the same when nothing was used and little
    time passed: such a reading does not vote (it once made a fixed window look a bucket)."""
    requests = Reading(budgets={"requests": Budget(limit=1, remaining=0, reset_s=2.95)})
    later = Reading(budgets={"requests": Budget(limit=1, remaining=0, reset_s=2.93)})
    window = readings.observe(w.Window(id="api"), requests, 1.0, refused=False)
    window = readings.observe(window, later, 1.02, refused=True)
    assert window.regime is w.Regime.UNKNOWN and window.refill.votes == ()


def test_endpoints_behind_one_api_key_share_one_window() -> None:
    """Two endpoints with `share: org`: one window holds both, so together they admit what
    the one key allows (500 tokens), not twice that."""
    org = Limits(tpm=500, share="org")
    state = start(hosted("east", org), hosted("west", org))
    assert set(state.windows) == {"org"} and state.windows["org"].replicas == ("east", "west")
    state, first = ask(state, "t1", at=1.0)
    state, second = ask(state, "t2", at=1.0)
    state, third = ask(state, "t3", at=1.0)
    assert len(placed(first) | placed(second)) == 2 and third == ()
    assert "t3" in state.budget_held


def unprobed_api(rid: str = "api") -> State:
    """An endpoint given without `limits` whose probes read no engine load (a hosted API)."""
    state = initial_state([endpoint(rid)])
    state, _ = decide(state, ProbeResult(at=0.0, replica_id=rid, healthy=True))
    return state


def test_an_endpoint_given_without_limits_takes_one_turn_at_a_time_until_its_first_reply() -> None:
    state = unprobed_api()
    api = state.replicas["api"]
    assert api.unread and api.capacity == 1 and not api.limited and not open_replicas(state)
    state, first = ask(state, "t1", at=1.0)
    state, second = ask(state, "t2", at=1.0, cls=ServiceClass.BATCH)
    state, third = ask(state, "t3", at=1.0)
    assert placed(first) == {"t1": "api"} and second == () and third == ()
    assert set(state.held) == {"t2", "t3"}  # in the placement queues, by the usual rules
    # The reply's headers say 1,000 tokens a minute with 700 left: the held turns go to the
    # gate, and both fit at once.
    state, after = done(state, "t1", at=2.0, reading=tokens_left(700, 30.0), read_at=1.5)
    assert placed(after) == {"t3": "api", "t2": "api"}
    assert state.windows["api"].levels["tokens"].limit == 1000
    assert state.replicas["api"].limited and not state.replicas["api"].unread


def test_an_endpoint_whose_first_reply_reports_no_limits_has_none_from_then_on() -> None:
    state = unprobed_api()
    state, _ = ask(state, "t1", at=1.0)
    state, _ = ask(state, "t2", at=1.0)
    state, _ = ask(state, "t3", at=1.0)
    state, after = done(state, "t1", at=2.0)  # no rate-limit headers
    assert placed(after) == {"t2": "api", "t3": "api"}
    assert "api" not in state.windows and not state.replicas["api"].limited
    assert not state.replicas["api"].unread and state.replicas["api"].capacity is None
    assert [r.id for r in open_replicas(state)] == ["api"]
    assert status_view(state, 2.0)["budgets"] == []
    # A refusal with headers later brings a window back.
    refusal = Reading(
        retry_after_s=5.0, budgets={"tokens": Budget(limit=1000, remaining=0, reset_s=5.0)}
    )
    state, _ = decide(
        state, TurnFailed(at=3.0, turn_id="t2", reading=refusal, reading_at=3.0, refused=True)
    )
    assert state.windows["api"].cooldown_until == pytest.approx(8.0)
    assert state.replicas["api"].limited and not open_replicas(state)


def test_a_failed_first_turn_teaches_nothing_the_endpoint_stays_unread() -> None:
    state = unprobed_api()
    state, _ = ask(state, "t1", at=1.0)
    state, held = ask(state, "t2", at=1.0)
    assert held == ()
    state, after = decide(state, TurnFailed(at=2.0, turn_id="t1", reason="engine status 500"))
    assert placed(after) == {"t2": "api"}  # the next turn goes, still one at a time
    state, third = ask(state, "t3", at=2.0)
    assert third == () and state.replicas["api"].unread


def test_a_probe_that_reads_engine_load_frees_an_endpoint_given_without_limits() -> None:
    # `limits: {}` asks for a window learned from replies: load on a probe does not drop it.
    state = initial_state([endpoint("engine"), hosted("api")])
    assert state.replicas["engine"].unread and not state.replicas["api"].unread
    for rid in ("engine", "api"):
        state, _ = decide(state, ProbeResult(at=0.0, replica_id=rid, healthy=True, **IDLE))
    assert not state.replicas["engine"].unread and "engine" not in state.windows
    assert state.replicas["api"].limited and "api" in state.windows
    assert [r.id for r in open_replicas(state)] == ["engine"]


def test_a_stated_empty_window_whose_first_reply_reports_no_limits_has_none_either() -> None:
    state = start(hosted("api"))
    state, _ = ask(state, "t1", at=1.0)
    state, held = ask(state, "t2", at=1.0)
    assert held == ()
    state, after = done(state, "t1", at=2.0)
    assert placed(after) == {"t2": "api"} and "api" not in state.windows
