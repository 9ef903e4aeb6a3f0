"""Replay reproduces the live run at every journaled step: a property over random runs.

Pure, no event loop.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from luftpause.runtime import journal as j
from luftpause.runtime import machine as m

# One round: for each call (1 or 2), whether it needs approval and the answer given.
Round = list[tuple[bool, bool]]
rounds_strategy = st.lists(
    st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=2),
    min_size=0,
    max_size=4,
)


def comparable(state: m.RunState) -> tuple[object, ...]:
    return (
        m.canonical(state),
        state.phase,
        state.pending,
        state.approvals,
        state.asking,
        state.pending_usage,
    )


@given(rounds_strategy, st.booleans())
def test_replay_of_what_a_run_journaled_gives_the_state_it_had_when_journaling(
    rounds: list[Round], finish: bool
) -> None:
    """Invariant: after every step that wrote a record, replaying the records so far gives
    the live state (phase, messages, pending calls, answers, usage)."""
    spec = m.RunSpec(handle="h", task="t", model="sim", parallel_tool_calls=True)
    state = m.start(spec)
    records = [j.spawned_record(spec)]

    def feed(event: m.Event) -> None:
        nonlocal state
        state, decisions = m.step(state, event)
        written = [r for d in decisions if (r := j.record_of("h", d)) is not None]
        records.extend(written)
        if written:
            assert comparable(j.replay(records).runs["h"]) == comparable(state)

    for n, round_ in enumerate(rounds):
        calls = tuple(
            m.ToolCall(id=f"c{n}_{i}", name="x", arguments="{}") for i in range(len(round_))
        )
        usage = m.Usage(turns=1, prompt_tokens=n + 1)
        feed(m.TurnCompleted(content=None, tool_calls=calls, usage=usage))
        for call, (ask, allow) in zip(calls, round_, strict=True):
            if ask:
                feed(m.ApprovalAsked(call_id=call.id))
                feed(m.ApprovalDecided(call_id=call.id, allow=allow))
        results = tuple(m.ToolResult(call_id=c.id, name="x", content="r") for c in calls)
        feed(m.ToolsReturned(results=results))
    feed(m.TurnCompleted(content="done") if finish else m.Cancel(reason="stop"))
    assert j.replay(records).ignored == 0
