"""New runs go where their opening (tools and first messages) was served: the core's index."""

from __future__ import annotations

from luftpause.common.prefixes import opening_keys
from luftpause.scheduler.core.decide import decide
from luftpause.scheduler.core.events import Admit
from luftpause.scheduler.core.openings import INDEX_SIZE, OpeningIndex, record
from luftpause.scheduler.core.state import State
from tests.scheduler.helpers import MODEL, placed, pool

SHARED = [{"role": "system", "content": "a long shared preamble"}]


def opening(task: str, system: list[dict[str, str]] = SHARED) -> tuple[tuple[int, int], ...]:
    return opening_keys([*system, {"role": "user", "content": task}])


def start(state: State, turn: str, run: str, keys: tuple[tuple[int, int], ...]) -> str | None:
    _, actions = decide(state, Admit(at=1, turn_id=turn, run_id=run, model=MODEL, opening=keys))
    return placed(actions).get(turn)


def admit_to(state: State, turn: str, run: str, keys: tuple[tuple[int, int], ...]) -> State:
    state, _ = decide(state, Admit(at=1, turn_id=turn, run_id=run, model=MODEL, opening=keys))
    return state


def test_a_new_run_goes_where_its_opening_was_served() -> None:
    state = admit_to(pool("a", "b"), "t0", "r0", opening("task 0"))
    home = state.turns["t0"].replica
    other = ({"a", "b"} - {home}).pop()
    # The other replica is less loaded, but within the slack: the shared preamble wins.
    assert start(state, "t1", "r1", opening("task 1")) == home
    # Without a shared opening the least loaded one takes it.
    assert start(state, "t2", "r2", opening("task 2", system=[])) == other


def test_load_beats_a_cached_opening_past_the_slack() -> None:
    state = admit_to(pool("a", "b"), "t0", "r0", opening("task 0"))
    home = state.turns["t0"].replica
    for i in range(3):  # turns a dataplane placed there itself
        state, _ = decide(
            state, Admit(at=1, turn_id=f"x{i}", run_id=f"x{i}", model=MODEL, placed_on=home)
        )
    assert state.replicas[home].in_flight == 4
    assert start(state, "t1", "r1", opening("task 1")) != home


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
