"""Replay reproduces the live run at every journaled step: a property over random runs.

Pure, no event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m

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


class Journaled:
    """A run stepped live, its records kept as the journal would hold them."""

    def __init__(self, spec: m.RunSpec) -> None:
        self.state = m.start(spec)
        self.records = [j.spawned_record(spec)]

    def checked(self, view: Callable[[m.RunState], object]) -> Callable[[m.Event], None]:
        """Step with an event; whenever it wrote a record, replay must give the live state."""

        def feed(event: m.Event) -> None:
            self.state, decisions = m.step(self.state, event)
            written = [r for d in decisions if (r := j.record_of("h", d)) is not None]
            self.records.extend(written)
            if written:
                assert view(j.replay(self.records).runs["h"]) == view(self.state)

        return feed


@given(rounds_strategy, st.booleans())
def test_replay_of_what_a_run_journaled_gives_the_state_it_had_when_journaling(
    rounds: list[Round], finish: bool
) -> None:
    """Invariant: after every step that wrote a record, replaying the records so far gives
    the live state (phase, messages, pending calls, answers, usage)."""
    run = Journaled(m.RunSpec(handle="h", task="t", model="sim", parallel_tool_calls=True))
    feed = run.checked(comparable)

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
    assert j.replay(run.records).ignored == 0


# Each call's own story within its round; a round's stories are interleaved at random.
STORIES = {
    "refused": ["result"],  # answered without sending: an unknown tool, bad arguments
    "answered": ["send", "result"],
    "sent_again": ["send", "send", "result"],
    "approved": ["ask", "yes", "send", "result"],
    "asked_again": ["ask", "yes", "send", "ask", "no", "result"],
}


Rounds = list[tuple[list[str], list[tuple[int, str]]]]


@st.composite
def interleaved_rounds(draw: st.DrawFn) -> Rounds:
    """Rounds of (call index, action), each call's actions in order, the calls interleaved; one
    question open at a time (the shell asks one after the other)."""
    rounds = []
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        stories = draw(st.lists(st.sampled_from(sorted(STORIES)), min_size=1, max_size=3))
        queues = [[(i, a) for a in STORIES[name]] for i, name in enumerate(stories)]
        steps: list[tuple[int, str]] = []
        open_question = False
        while any(queues):
            live = [q for q in queues if q and not (open_question and q[0][1] == "ask")]
            step = draw(st.sampled_from(live)).pop(0)
            open_question = step[1] == "ask" or (open_question and step[1] not in ("yes", "no"))
            steps.append(step)
        rounds.append((stories, steps))
    return rounds


def settled(state: m.RunState) -> tuple[object, ...]:
    """`comparable`, a question still open taken as not asked: a question is journaled only
    with the turn it begins (format 1's way) or by its answer, and one open at a crash is asked
    again on resume."""
    if state.phase is m.Phase.AWAITING_APPROVAL:
        state = replace(state, phase=m.Phase.TOOLS, asking=None)
    return (*comparable(state), state.sent, state.returned, state.turn_recorded)


@given(interleaved_rounds())
def test_replay_after_every_per_call_record_gives_the_live_state(rounds: Rounds) -> None:
    """Invariant: with calls sent, sent again, asked about again and answered in any order
    within their round, replaying the records after each one gives the live state (the calls
    out, the results in, the answers, whether the turn is journaled)."""
    spec = m.RunSpec(
        handle="h", task="t", model="sim", parallel_tool_calls=True, max_tool_calls=100
    )
    run = Journaled(spec)
    feed = run.checked(settled)

    for n, (stories, steps) in enumerate(rounds):
        calls = tuple(
            m.ToolCall(id=f"c{n}_{i}", name="x", arguments="{}") for i in range(len(stories))
        )
        # A call asked about again is of a tool that is neither idempotent nor read-only.
        resendable = [
            story == "sent_again" or (story != "asked_again" and i % 2 == 0)
            for i, story in enumerate(stories)
        ]
        feed(m.TurnCompleted(content=None, tool_calls=calls, usage=m.Usage(turns=1)))
        asked: set[int] = set()
        for i, action in steps:
            cid = calls[i].id
            if action == "ask":
                asked.add(i)
                feed(m.ApprovalAsked(call_id=cid))
            elif action in ("yes", "no"):
                feed(m.ApprovalDecided(call_id=cid, allow=action == "yes"))
            elif action == "send":
                feed(m.CallSending(call_id=cid, resendable=resendable[i], approval=i in asked))
            else:
                feed(m.CallReturned(result=m.ToolResult(call_id=cid, name="x", content=cid)))
    feed(m.TurnCompleted(content="done"))
    assert j.replay(run.records).ignored == 0
