"""Residency rules of the decision core: soft affinity for idle runs, and the KV rule.

Pure tests: events in, state and actions out, no event loop.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from luftpause.common.config import Endpoint
from luftpause.scheduler.core import holds, residency
from luftpause.scheduler.core.decide import DEFAULT_RULES, decide, initial_state
from luftpause.scheduler.core.events import (
    Admit,
    FirstToken,
    ProbeResult,
    RunEnded,
    Tick,
    TurnFinished,
    TurnStarted,
)
from luftpause.scheduler.core.model import NEW_RUN_MAX_HOLD_S, Rules, ServiceClass
from luftpause.scheduler.core.state import State
from tests.scheduler.helpers import MODEL, admit, cap, placed

BATCH = ServiceClass.BATCH


def kv_pool(*ids: str, kv: int = 0, rules: Rules = DEFAULT_RULES) -> State:
    state = initial_state(
        (Endpoint(id=i, url=f"http://{i}:1", models=frozenset({MODEL}), kv_tokens=kv) for i in ids),
        rules=rules,
    )
    for i in ids:
        state, _ = decide(state, ProbeResult(at=0.0, replica_id=i, healthy=True))
    return state


def finish(state: State, turn: str, *, at: float, prompt: int = 1000, tools: bool = False) -> State:
    state, _ = decide(
        state,
        TurnFinished(
            at=at, turn_id=turn, tool_calls=tools, prompt_tokens=prompt, completion_tokens=20
        ),
    )
    return state


def learn_runs_come_back(state: State, *, at: float = 1.0) -> State:
    """Three idle ends of one run, each followed by its next turn 0.5 s later."""
    for i in range(4):
        state, _ = admit(state, f"learn{i}", "learner", at=at + i)
        state = finish(state, f"learn{i}", at=at + i + 0.5, prompt=100)
    state, _ = decide(state, RunEnded(at=at + 5, run_id="learner"))
    return state


def test_an_idle_run_that_is_expected_back_waits_for_its_replica() -> None:
    state = learn_runs_come_back(cap(cap(kv_pool("a", "b"), "a", 1), "b", 5))
    state, actions = admit(state, "t1", "r1", at=10)
    home = placed(actions)["t1"]
    state = finish(state, "t1", at=11)
    assert state.runs["r1"].resident
    state, _ = admit(state, "t2", "other", at=11.1)
    if home == "b":
        for i in range(5):
            state, _ = admit(state, f"fill{i}", f"fill{i}", at=11.2)
    state, actions = admit(state, "t3", "r1", at=11.3)
    assert not placed(actions) and state.held["t3"].bucket == ("r", home, MODEL)


def test_an_idle_run_moves_once_it_waited_longer_than_a_reread_would_take() -> None:
    state = learn_runs_come_back(cap(cap(kv_pool("a", "b"), "a", 1), "b", 5))
    state, _ = admit(state, "t1", "r1", at=10)
    state = finish(state, "t1", at=11)
    state, _ = admit(state, "t2", "other", at=11.1)  # fills a, r1's replica
    state, actions = admit(state, "t3", "r1", at=11.2)
    assert not placed(actions)
    wait = holds.soft_wait_s(state, state.runs["r1"])
    state, actions = decide(state, Tick(at=11.2 + wait - 0.5))
    assert not placed(actions)
    state, actions = decide(state, Tick(at=11.2 + wait + 0.01))
    assert placed(actions) == {"t3": "b"}
    assert state.runs["r1"].replica == "b"


def test_an_idle_run_stays_queued_at_its_replica_while_every_other_replica_is_full() -> None:
    """Past its wait bound a move would start the turn no sooner: it waits for a replica with
    room, and moves only once one has some."""
    state = learn_runs_come_back(cap(cap(kv_pool("a", "b"), "a", 1), "b", 1))
    state, _ = admit(state, "t1", "r1", at=10)
    state = finish(state, "t1", at=11)
    home = state.runs["r1"].replica
    other = "b" if home == "a" else "a"
    state, _ = admit(state, "t2", "fills-home", at=11.1)
    state, _ = admit(state, "t3", "fills-other", at=11.1)
    assert {t.replica for t in state.turns.values()} == {"a", "b"}
    state, actions = admit(state, "t4", "r1", at=11.2)
    wait = holds.soft_wait_s(state, state.runs["r1"])
    state, actions = decide(state, Tick(at=11.2 + wait + 5.0))
    assert not placed(actions) and state.runs["r1"].resident
    busy_there = next(t.id for t in state.turns.values() if t.replica == other)
    state, actions = decide(
        state, TurnFinished(at=11.2 + wait + 5.5, turn_id=busy_there, tool_calls=False)
    )
    state, actions = decide(state, Tick(at=11.2 + wait + 6.0))
    assert placed(actions) == {"t4": other}


def test_the_wait_bound_follows_the_learned_cost_of_reading_a_context() -> None:
    state = kv_pool("a")
    for i, uncached in enumerate((100, 1100, 2100, 3100)):
        state, _ = admit(state, f"t{i}", f"r{i}", at=i)
        state, _ = decide(state, TurnStarted(at=i + 0.1, turn_id=f"t{i}"))
        state, _ = decide(state, FirstToken(at=i + 0.1 + 0.001 * uncached, turn_id=f"t{i}"))
        state = finish(state, f"t{i}", at=i + 0.9, prompt=uncached)
    assert state.replicas["a"].prefill.s_per_token == pytest.approx(0.001)
    run = state.runs["r3"]
    reread = 0.001 * (run.context_tokens - run.shared_tokens)
    assert holds.soft_wait_s(state, run) == pytest.approx(holds.SOFT_WAIT_FACTOR * reread)


def test_the_wait_bound_grows_with_the_sequences_a_read_would_stall() -> None:
    state = kv_pool("a")
    for i, uncached in enumerate((100, 1100, 2100, 3100)):
        state, _ = admit(state, f"t{i}", f"r{i}", at=i)
        state, _ = decide(state, TurnStarted(at=i + 0.1, turn_id=f"t{i}"))
        state, _ = decide(state, FirstToken(at=i + 0.1 + 0.001 * uncached, turn_id=f"t{i}"))
        state = finish(state, f"t{i}", at=i + 0.9, prompt=uncached)
    alone = holds.soft_wait_s(state, state.runs["r3"])
    state, _ = decide(state, ProbeResult(at=5, replica_id="a", healthy=True, running=8, waiting=0))
    assert holds.soft_wait_s(state, state.runs["r3"]) == pytest.approx(8 * alone)


def test_runs_that_do_not_come_back_after_an_idle_end_are_not_kept() -> None:
    state = kv_pool("a", "b")
    for i in range(5):
        state, _ = admit(state, f"t{i}", f"r{i}", at=i)
        state = finish(state, f"t{i}", at=i + 0.5)
        assert not state.runs[f"r{i}"].resident
    assert state.replicas["a"].resident_tokens == state.replicas["b"].resident_tokens == 0


def test_a_run_paused_on_a_tool_is_resident_until_it_is_not_back_in_time() -> None:
    state = kv_pool("a")
    state, _ = admit(state, "t1", "r1", at=1)
    state = finish(state, "t1", at=2, tools=True)
    run = state.runs["r1"]
    assert run.resident and state.replicas["a"].resident_tokens == run.footprint
    state, _ = decide(state, Tick(at=run.resident_until + 1))
    assert not state.runs["r1"].resident and state.replicas["a"].resident_tokens == 0


def paused_pair(kv: int, rules: Rules = DEFAULT_RULES) -> State:
    """Two batch runs paused on a tool on replica a, their contexts 1,200 tokens each."""
    state = kv_pool("a", kv=kv, rules=rules)
    for i in range(2):
        state, _ = admit(state, f"t{i}", f"r{i}", cls=BATCH, at=1)
        state = finish(state, f"t{i}", at=2, prompt=1200, tools=True)
    return state


def test_a_new_batch_run_waits_while_the_engine_is_busy_and_resident_runs_fill_its_pool() -> None:
    state = paused_pair(kv=3500)
    assert state.replicas["a"].resident_tokens > 2400
    # A resident run comes back at once (the rule never holds it): its prompt is to be read.
    state, actions = admit(state, "t3", "r0", cls=BATCH, at=2.5)
    assert placed(actions) == {"t3": "a"} and state.replicas["a"].pending_prefill > 0
    state, actions = admit(state, "t2", "new", cls=BATCH, at=3)
    assert not placed(actions) and state.held["t2"].bucket == ("m", "", MODEL)
    # One of them ends: its KV is free, and the new run starts.
    state, actions = decide(state, RunEnded(at=3.2, run_id="r1"))
    assert placed(actions) == {"t2": "a"}


def test_an_engine_with_nothing_left_to_read_takes_a_new_run_past_its_pool() -> None:
    """Holding a new run while its engine has nothing queued would only leave it idle."""
    state = paused_pair(kv=3500)
    assert not state.replicas["a"].new_batch_fits and state.replicas["a"].pending_prefill == 0
    _, actions = admit(state, "t2", "new", cls=BATCH, at=3)
    assert placed(actions) == {"t2": "a"}
    # Held while a returning run's prompt is read, it goes once that prompt's first token came.
    state, _ = admit(state, "t3", "r0", cls=BATCH, at=2.5)
    state, actions = admit(state, "t2", "new", cls=BATCH, at=3)
    assert not placed(actions)
    state, actions = decide(state, FirstToken(at=3.1, turn_id="t3"))
    assert placed(actions) == {"t2": "a"}


def learned_pool(kv: int, ms_per_token: float) -> State:
    """Replica a with a `kv`-token pool, its reading learned at `ms_per_token`, and batch runs
    learned to come back 2 s after a tool call; then two batch runs paused on a tool there,
    their contexts 1,200 tokens each, and nothing left to read."""
    state = kv_pool("a", kv=kv)
    for i, uncached in enumerate((100, 1100, 2100, 3100, 600, 1600)):
        t0, run = 10.0 * i, f"learn{i}"
        state, _ = admit(state, f"l{i}", run, cls=BATCH, at=t0)
        state, _ = decide(state, TurnStarted(at=t0 + 0.1, turn_id=f"l{i}"))
        ttft = 0.001 * ms_per_token * uncached
        state, _ = decide(state, FirstToken(at=t0 + 0.1 + ttft, turn_id=f"l{i}"))
        state = finish(state, f"l{i}", at=t0 + 0.9, prompt=uncached, tools=True)
        state, _ = admit(state, f"l{i}b", run, cls=BATCH, at=t0 + 2.9)
        state = finish(state, f"l{i}b", at=t0 + 3.5, prompt=uncached + 50)
        state, _ = decide(state, RunEnded(at=t0 + 4.0, run_id=run))
    assert state.replicas["a"].prefill.s_per_token == pytest.approx(0.001 * ms_per_token)
    for i in range(2):
        state, _ = admit(state, f"t{i}", f"r{i}", cls=BATCH, at=70)
        state = finish(state, f"t{i}", at=71, prompt=1200, tools=True)
    a = state.replicas["a"]
    assert not a.new_batch_fits and not a.new_interactive_fits and a.pending_prefill == 0
    return state


def test_an_engine_that_rereads_its_pool_before_runs_come_back_takes_a_new_run_past_it() -> None:
    """A pool of 3,500 tokens read again in 0.26 s, runs away 2 s: what a new run pushes out
    is read again long before it is needed, and holding the run would leave the batch short."""
    state = learned_pool(kv=3500, ms_per_token=0.1)
    assert state.replicas["a"].spills
    _, actions = admit(state, "t2", "new", cls=BATCH, at=71.5)
    assert placed(actions) == {"t2": "a"}


def test_an_engine_slower_to_reread_its_pool_than_runs_are_away_holds_a_new_run() -> None:
    """Read again in 2.6 s, runs away 2 s: the paused runs would come back to contexts not read
    yet, every turn reading its whole context (the engines of the matrix's thrash cells)."""
    state = learned_pool(kv=3500, ms_per_token=1.0)
    assert not state.replicas["a"].spills
    state, actions = admit(state, "t2", "new", cls=BATCH, at=71.5)
    assert not placed(actions) and state.held["t2"].bucket == ("m", "", MODEL)
    state, actions = decide(state, RunEnded(at=72, run_id="r1"))
    assert placed(actions) == {"t2": "a"}


def test_an_engine_reads_as_fast_as_the_fastest_turn_it_read() -> None:
    """A queue only adds to a turn's time to first token: one that waited behind others does
    not make the engine look slower, one that read alone shows its speed."""
    fastest = residency.fastest_read(None, 1000, 0.1)
    assert fastest == pytest.approx(1e-4)
    assert residency.fastest_read(fastest, 500, 2.0) == fastest  # queued
    assert residency.fastest_read(fastest, 2000, 0.1) == pytest.approx(5e-5)
    assert residency.fastest_read(fastest, 0, 0.5) == fastest  # all of it cached


def test_a_first_token_measured_by_the_dataplane_times_the_reading() -> None:
    """Started and first-token events may wait for company on the Report stream: their arrival
    does not time the reading; the dataplane's own measure does."""
    state = kv_pool("a")
    state, _ = admit(state, "t1", "r1", at=1.0)
    state, _ = decide(state, TurnStarted(at=1.6, turn_id="t1"))  # sent with its first token
    state, _ = decide(state, FirstToken(at=1.6, turn_id="t1", after_s=0.25))
    turn = state.turns["t1"]
    assert turn.first_token_at - turn.started_at == pytest.approx(0.25)
    state = finish(state, "t1", at=2.0, prompt=2500)
    assert state.replicas["a"].read_s_per_token == pytest.approx(0.25 / 2500)


def test_with_the_kv_rule_off_a_new_run_starts_while_the_engine_is_busy() -> None:
    state = paused_pair(kv=3500, rules=Rules().switched(["kv_rule"], on=False))
    state, _ = admit(state, "t3", "r0", cls=BATCH, at=2.5)
    _, actions = admit(state, "t2", "new", cls=BATCH, at=3)
    assert placed(actions) == {"t2": "a"}


def test_a_new_interactive_run_may_start_where_batch_may_not() -> None:
    state = paused_pair(kv=4400)
    resident = state.replicas["a"].resident_tokens
    new_run = round(state.sizes.new_run_tokens)
    assert 0.75 * 4400 < resident + new_run <= 0.875 * 4400
    state, _ = admit(state, "t9", "r0", cls=BATCH, at=2.5)  # busy reading
    state, actions = admit(state, "t2", "b-new", cls=BATCH, at=3)
    assert not placed(actions)
    state, actions = admit(state, "t3", "i-new", at=3)
    assert placed(actions) == {"t3": "a"}


def test_a_new_run_goes_where_it_fits_rather_than_push_resident_runs_out() -> None:
    state = kv_pool("a", "b", kv=3500)
    state, actions = admit(state, "t0", "r0", cls=BATCH, at=1)
    full = placed(actions)["t0"]
    state, _ = admit(state, "t1", "r1", cls=BATCH, at=1)
    state = finish(state, "t0", at=2, prompt=2500, tools=True)
    state = finish(state, "t1", at=2, prompt=100, tools=True)
    if state.runs["r1"].replica == full:
        return  # both on one replica: nothing to choose
    _, actions = admit(state, "t2", "new", cls=BATCH, at=3, size=8000)  # about 2000 tokens
    assert placed(actions) == {"t2": ({"a", "b"} - {full}).pop()}


def test_a_replica_with_nothing_resident_takes_a_run_bigger_than_its_pool() -> None:
    state = kv_pool("a", kv=500)
    _, actions = decide(
        state,
        Admit(at=1, turn_id="t1", run_id="big", model=MODEL, prompt_bytes=40_000),
    )
    assert placed(actions) == {"t1": "a"}


def test_a_new_run_held_by_the_kv_rule_goes_anywhere_after_the_longest_hold() -> None:
    state = kv_pool("a", kv=3000)
    state, _ = admit(state, "t0", "learner", cls=BATCH, at=0)
    state = finish(state, "t0", at=0.5, prompt=1000)  # a new run needs about 1000 tokens
    for i in range(2):  # two long turns in flight: resident, never expiring
        state, _ = decide(
            state,
            Admit(
                at=1,
                turn_id=f"long{i}",
                run_id=f"r{i}",
                model=MODEL,
                service_class=BATCH,
                prompt_bytes=4000,
            ),
        )
    state, actions = admit(state, "t2", "new", cls=BATCH, at=3)
    assert not placed(actions)
    state, actions = decide(state, Tick(at=3 + NEW_RUN_MAX_HOLD_S - 1))
    assert not placed(actions)
    state, actions = decide(state, Tick(at=3 + NEW_RUN_MAX_HOLD_S))
    assert placed(actions) == {"t2": "a"}


def test_a_batching_engine_is_never_capped_by_its_queue() -> None:
    state = kv_pool("a")
    full = ProbeResult(
        at=1, replica_id="a", healthy=True, running=20, waiting=5, kv_total=1000, kv_used=950
    )
    state, _ = decide(state, full)
    assert state.replicas["a"].cap is None and state.replicas["a"].kv_bound
    backlog = ProbeResult(
        at=2, replica_id="a", healthy=True, running=8, waiting=5, kv_total=1000, kv_used=300
    )
    state, _ = decide(state, backlog)
    state, _ = decide(state, backlog)
    assert state.replicas["a"].cap is None and not state.replicas["a"].kv_bound


def test_a_batching_engine_is_capped_at_the_most_it_runs() -> None:
    state = kv_pool("a")
    probe = ProbeResult(
        at=1, replica_id="a", healthy=True, running=2, waiting=0, kv_total=1000, max_running=3
    )
    state, _ = decide(state, probe)
    assert state.replicas["a"].cap is None  # open while it runs fewer than it can
    for i in range(5):
        state, _ = admit(state, f"t{i}", f"r{i}", at=2)
    state, _ = decide(state, probe)
    assert state.replicas["a"].cap == 3  # our turns reached its most
    state, _ = decide(state, replace(probe, running=3, waiting=2))
    assert state.replicas["a"].cap == 3


def test_an_engine_without_a_known_pool_is_capped_at_what_it_runs_when_it_queues() -> None:
    state = kv_pool("a")
    state, _ = decide(state, ProbeResult(at=1, replica_id="a", healthy=True, running=8, waiting=5))
    assert state.replicas["a"].cap == 8


def test_the_kv_pool_in_the_endpoint_file_wins_over_the_engines() -> None:
    state = kv_pool("a", kv=5000)
    state, _ = decide(
        state,
        ProbeResult(at=1, replica_id="a", healthy=True, running=0, waiting=0, kv_total=9000),
    )
    assert state.replicas["a"].kv_tokens == 5000
    state = kv_pool("b")
    state, _ = decide(
        state,
        ProbeResult(at=1, replica_id="b", healthy=True, running=0, waiting=0, kv_total=9000),
    )
    assert state.replicas["b"].kv_tokens == 9000


def test_a_replica_closed_to_new_runs_is_not_open_to_dataplanes() -> None:
    from luftpause.scheduler.core.placement import is_open

    state = kv_pool("a", kv=3000)
    assert is_open(state.replicas["a"])
    for i in range(2):
        state, _ = admit(state, f"t{i}", f"r{i}", cls=BATCH, at=1)
        state = finish(state, f"t{i}", at=2, prompt=1200, tools=True)
    assert not is_open(state.replicas["a"])


def test_a_run_is_not_kept_after_the_round_its_kind_stops_coming_back() -> None:
    state = kv_pool("a")
    t = 0.0
    for r in range(4):  # runs of three turns, every turn ending without tool calls
        for k in range(3):
            state, _ = admit(state, f"t{r}-{k}", f"r{r}", at=t)
            state = finish(state, f"t{r}-{k}", at=t + 0.2)
            t += 0.7
    state, _ = admit(state, "u0", "last", at=t)
    state = finish(state, "u0", at=t + 0.2)
    assert state.runs["last"].resident  # after its first round it is expected back
    for k in (1, 2):
        state, _ = admit(state, f"u{k}", "last", at=t + 0.7 * k)
        state = finish(state, f"u{k}", at=t + 0.7 * k + 0.2)
    assert not state.runs["last"].resident  # after the third, runs like it never came back


def test_a_run_counts_as_back_when_its_turn_arrives_not_when_a_held_turn_is_placed() -> None:
    # The replica's one slot is taken for the whole test: runs end their first round (on turns
    # their dataplane placed past the cap) and their next turns wait. Counted only once placed,
    # none of those returns would count, and runs like these would seem never to come back.
    state = cap(kv_pool("a"), "a", 1)
    state, _ = admit(state, "block", "blocker", cls=BATCH, at=0.0)
    for r in range(6):
        t = float(r)
        first = Admit(
            at=t, turn_id=f"first{r}", run_id=f"r{r}", model=MODEL, placed_on="a", dataplane="dp"
        )
        state, _ = decide(state, first)
        state = finish(state, f"first{r}", at=t + 0.5)
        if r == 5:
            break
        state, _ = admit(state, f"next{r}", f"r{r}", at=t + 1.0)
        assert f"next{r}" in state.held
    learned = state.comebacks[("interactive", False, 1)]
    assert learned.back == pytest.approx(learned.ends - 1.0), learned  # all but r5's end
    assert state.runs["r5"].resident  # expected back: its prefix is kept


def test_status_shows_each_replicas_working_set_against_its_pool() -> None:
    from luftpause.scheduler.core.status import status_view

    state = kv_pool("a", kv=3500)
    for i in range(2):
        state, _ = admit(state, f"t{i}", f"r{i}", cls=BATCH, at=1)
        state = finish(state, f"t{i}", at=2, prompt=1200, tools=True)
    view = status_view(state, now=3)
    kv = view["replicas"][0]["kv"]
    assert kv["tokens"] == 3500 and kv["resident_runs"] == 2
    assert kv["resident_tokens"] == state.replicas["a"].resident_tokens > 2400
    assert (kv["new_batch_fits"], kv["new_interactive_fits"]) == (False, False)
    learned = view["learned"]
    assert learned["new_run_tokens"] > 1200 and learned["reply_tokens"] == 20
    assert learned["residency_s"]["batch/tool"] > 0
