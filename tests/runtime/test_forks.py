"""Forks as records: a fork begins at its source's last complete round, replays alone, and a
batch of records counts whole or not at all. Pure, no event loop."""

from __future__ import annotations

import json
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from luftpause.runtime.core import forks
from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m

SPEC = m.RunSpec(handle="run-1", task="rivers", model="sim", system="be brief", key="team")
LOOKUP = m.ToolCall(id="c1", name="lookup", arguments="{}")


def one_round(state: m.RunState, call_id: str = "c1") -> tuple[m.RunState, list[dict]]:
    """One complete round of `lookup`, and the records it journals."""
    call = m.ToolCall(id=call_id, name="lookup", arguments="{}")
    usage = m.Usage(turns=1, prompt_tokens=40, completion_tokens=5, turn_seconds=0.5)
    state, _ = m.step(state, m.TurnCompleted(content=None, tool_calls=(call,), usage=usage))
    result = m.ToolResult(call_id=call_id, name="lookup", content="found", seconds=0.25)
    state, decisions = m.step(state, m.ToolsReturned(results=(result,)))
    h = state.spec.handle
    return state, [r for d in decisions if (r := j.record_of(h, d)) is not None]


def source_after_one_round() -> tuple[m.RunState, list[dict]]:
    state, records = one_round(m.start(SPEC))
    return state, [j.spawned_record(SPEC), *records]


def fork_of(state: m.RunState, handle: str = "run-f", instruction: str | None = None) -> dict:
    spec = forks.fork_spec(state.spec, handle, 100.0, caller="forker")
    return forks.forked_record(spec, state, instruction)


def test_a_fork_begins_with_its_sources_history_counters_and_spec() -> None:
    source, _ = source_after_one_round()
    fork = forks.begin(fork_of(source, instruction="be bold"))
    assert fork.messages == (*source.messages, {"role": "user", "content": "be bold"})
    assert (fork.rounds, fork.tool_calls, fork.tool_seconds) == (1, 1, 0.25)
    assert fork.usage == source.usage and fork.phase is m.Phase.RUNNING
    assert fork.spec.handle == "run-f" and fork.spec.spawned_at == 100.0
    assert (fork.spec.model, fork.spec.key, fork.spec.system) == ("sim", "team", "be brief")
    assert fork.spec.caller == "forker"


def test_a_fork_of_a_run_with_calls_in_flight_leaves_them_to_the_source() -> None:
    source, _ = source_after_one_round()
    waiting, _ = m.step(source, m.TurnCompleted(content=None, tool_calls=(LOOKUP,)))
    assert waiting.phase is m.Phase.TOOLS
    fork = forks.begin(fork_of(waiting))
    assert fork.pending == () and fork.rounds == 1 and fork.messages == source.messages
    assert isinstance(m.next_decision(fork), m.StartTurn)


def test_overrides_replace_the_sources_fields_and_none_keeps_them() -> None:
    spec = forks.fork_spec(SPEC, "run-f", 1.0, model="other", budget_tokens=None)
    assert (spec.model, spec.budget_tokens, spec.task) == ("other", None, "rivers")
    with pytest.raises(ValueError):
        forks.fork_spec(SPEC, "run-f", 1.0, service_class="urgent")


def test_a_fork_replays_from_its_own_records_without_its_sources() -> None:
    source, _ = source_after_one_round()
    record = json.loads(j.encode(fork_of(source)))
    fork, later = one_round(forks.begin(record), call_id="f1")
    replayed = j.replay([record, *later]).runs["run-f"]
    assert m.canonical(replayed) == m.canonical(fork) and replayed.rounds == 2


def test_a_batch_replays_as_its_records_and_a_torn_batch_as_none_of_them() -> None:
    source, records = source_after_one_round()
    batch = forks.batch_record([fork_of(source, "run-a"), fork_of(source, "run-b")])
    whole = j.encode(batch)
    decoder = j.JournalDecoder()
    replayed = j.replay(decoder.feed(b"".join(map(j.encode, records)) + whole))
    assert set(replayed.runs) == {"run-1", "run-a", "run-b"}
    decoder = j.JournalDecoder()
    torn = decoder.feed(b"".join(map(j.encode, records)) + whole[:-2]) + decoder.flush()
    assert set(j.replay(torn).runs) == {"run-1"}


def test_a_second_start_of_a_handle_is_ignored() -> None:
    source, records = source_after_one_round()
    replayed = j.replay([*records, fork_of(source, "run-1")])
    assert replayed.ignored == 1 and replayed.runs["run-1"].spec.caller == SPEC.caller


def test_a_start_record_whose_spec_names_another_run_is_refused() -> None:
    source, _ = source_after_one_round()
    with pytest.raises(j.JournalError):
        j.replay([{**fork_of(source), "run": "run-x"}])


@pytest.mark.parametrize(
    ("n", "given_", "expected"),
    [
        (2, None, (None, None)),
        (3, "same", ("same",) * 3),
        (2, ["a", "b"], ("a", "b")),
    ],
)
def test_instructions_are_none_one_for_all_or_one_each(
    n: int, given_: str | list[str] | None, expected: tuple[str | None, ...]
) -> None:
    assert forks.instructions_for(n, given_) == expected


@pytest.mark.parametrize(
    ("n", "given_", "why"),
    [
        (0, None, "from 1 to 16"),
        (17, None, "from 1 to 16"),
        (True, None, "whole number"),
        (2, ["a"], "1 given for 2"),
        (2, ["a", 3], "strings"),
    ],
)
def test_bad_fork_counts_and_instructions_are_refused(n: int, given_: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        # Bad input on purpose: a list holding a non-string is what the check must refuse.
        forks.instructions_for(n, cast("list[str] | None", given_))


@given(st.lists(st.integers(min_value=0, max_value=3), max_size=6))
def test_expanding_batches_keeps_every_record_in_order(sizes: list[int]) -> None:
    """Invariant: taking batches apart yields the plain records and each batch's records, in
    journal order, and nothing else."""
    counter = iter(range(1000))
    plain: list[dict] = []
    journal: list[dict] = []
    for size in sizes:
        inner = [{"type": "round", "run": f"r{next(counter)}"} for _ in range(max(size, 1))]
        plain += inner
        journal.append(forks.batch_record(inner) if size else inner[0])
    assert list(forks.expand(journal)) == plain
