"""New runs go where their opening (tools and first messages) was served: the core's index."""

from __future__ import annotations

from dataclasses import replace

from luftpause.common.prefixes import opening_keys
from luftpause.scheduler.core.decide import decide
from luftpause.scheduler.core.events import Admit, FirstToken
from luftpause.scheduler.core.model import Rules
from luftpause.scheduler.core.openings import INDEX_SIZE, OpeningIndex, record
from luftpause.scheduler.core.state import State
from tests.scheduler.helpers import MODEL, placed, pool

SHARED = [{"role": "system", "content": "a long shared preamble. " * 160}]  # about 4 kB
PROMPT_BYTES = 6000


def opening(task: str, system: list[dict[str, str]] = SHARED) -> tuple[tuple[int, int], ...]:
    return opening_keys([*system, {"role": "user", "content": task}])


def admit(
    turn: str, run: str, keys: tuple[tuple[int, int], ...], size: int = PROMPT_BYTES
) -> Admit:
    return Admit(at=1, turn_id=turn, run_id=run, model=MODEL, opening=keys, prompt_bytes=size)


def start(state: State, turn: str, run: str, keys: tuple[tuple[int, int], ...]) -> str | None:
    _, actions = decide(state, admit(turn, run, keys))
    return placed(actions).get(turn)


def read(state: State, turn: str) -> State:
    """The turn's first token came: its prompt is read, nothing of it is pending."""
    state, _ = decide(state, FirstToken(at=1.5, turn_id=turn))
    return state


def test_a_new_run_goes_where_its_opening_was_served() -> None:
    state, _ = decide(pool("a", "b"), admit("t0", "r0", opening("task 0")))
    state = read(state, "t0")
    home = state.turns["t0"].replica
    other = ({"a", "b"} - {home}).pop()
    # The other replica has fewer turns in flight, but reading the shared preamble again there
    # costs more: the opening wins.
    assert start(state, "t1", "r1", opening("task 1")) == home
    # Without a shared opening both read as much: the one with fewer turns in flight takes it.
    assert start(state, "t2", "r2", opening("task 2", system=[])) == other


def test_reading_queued_on_a_replica_outweighs_a_cached_opening() -> None:
    state, _ = decide(pool("a", "b"), admit("t0", "r0", opening("task 0")))
    state = read(state, "t0")
    home = state.turns["t0"].replica
    # Two new runs its dataplane sent there itself, their prompts not read yet: their reading
    # (two whole prompts) is queued ahead of anything placed there now.
    for i in range(2):
        state, _ = decide(state, replace(admit(f"x{i}", f"x{i}", ()), placed_on=home))
    assert state.replicas[home].pending_prefill > 1000
    assert start(state, "t1", "r1", opening("task 1")) != home
    # Once they are read, the cached opening wins again.
    state = read(read(state, "x0"), "x1")
    assert state.replicas[home].pending_prefill == 0
    assert start(state, "t1", "r1", opening("task 1")) == home


def test_with_the_openings_rule_off_a_served_opening_counts_for_nothing() -> None:
    state = pool("a", "b", rules=Rules().switched(["openings"], on=False))
    state, _ = decide(state, admit("t0", "r0", opening("task 0")))
    state = read(state, "t0")
    assert not state.openings
    home = state.turns["t0"].replica
    assert start(state, "t1", "r1", opening("task 1")) != home  # fewer in flight elsewhere


def test_the_index_keeps_the_most_recently_used_openings() -> None:
    index = OpeningIndex()
    first = opening("task first", system=[])
    index = record(index, first)
    for i in range(INDEX_SIZE):
        index = record(index, ((10_000 + i, 1),))
    assert len(index.keys) == INDEX_SIZE and first[0][0] not in index.keys
    index = record(index, ((10_000, 1),))  # used again: now the newest
    index = record(index, ((99, 1),))
    assert 10_000 in index.keys and 10_001 not in index.keys
