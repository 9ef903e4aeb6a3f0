"""The run state machine: pure, no event loop."""

from __future__ import annotations

import pytest

from luftpause.runtime.core import machine as m


def spec(**kw: object) -> m.RunSpec:
    return m.RunSpec(**({"handle": "run-1", "task": "rivers", "model": "sim"} | kw))  # type: ignore[arg-type]


def call(i: int, name: str = "lookup") -> m.ToolCall:
    return m.ToolCall(id=f"c{i}", name=name, arguments='{"query": "x"}')


def result(i: int, ok: bool = True) -> m.ToolResult:
    return m.ToolResult(call_id=f"c{i}", name="lookup", content=f"r{i}", ok=ok, seconds=0.5)


USAGE = m.Usage(turns=1, prompt_tokens=10, completion_tokens=5, turn_seconds=0.1)


def test_a_new_run_asks_for_a_turn_with_tools_and_its_system_prompt_first() -> None:
    state = m.start(spec(system="be brief"))
    decision = m.next_decision(state)
    assert isinstance(decision, m.StartTurn) and decision.offer_tools
    assert [msg["role"] for msg in decision.messages] == ["system", "user"]


def test_a_reply_with_a_tool_call_leads_to_calling_it_then_recording_the_round() -> None:
    state = m.start(spec())
    state, ds = m.step(state, m.TurnCompleted(content=None, tool_calls=(call(1),), usage=USAGE))
    assert state.phase is m.Phase.TOOLS and ds == (m.CallTools(calls=(call(1),)),)
    state, ds = m.step(state, m.ToolsReturned(results=(result(1, ok=False),)))
    assert state.phase is m.Phase.RUNNING
    assert (state.rounds, state.tool_calls, state.failed_tool_calls) == (1, 1, 1)
    [record] = ds
    assert isinstance(record, m.RecordRound) and record.round == 1 and record.usage == USAGE
    assert [msg["role"] for msg in state.messages] == ["user", "assistant", "tool"]


def test_a_reply_without_tool_calls_finishes_the_run_with_its_text() -> None:
    state, ds = m.step(m.start(spec()), m.TurnCompleted(content="done", usage=USAGE))
    assert state.phase is m.Phase.FINISHED and state.result == "done"
    assert ds == (m.RecordFinished(phase=m.Phase.FINISHED, result="done", error=None, usage=USAGE),)
    assert state.usage.turns == 1 and m.next_decision(state) is None


def test_once_the_tool_budget_is_spent_the_model_is_offered_no_tools() -> None:
    state = m.start(spec(max_tool_calls=1))
    state, _ = m.step(state, m.TurnCompleted(content=None, tool_calls=(call(1),)))
    state, _ = m.step(state, m.ToolsReturned(results=(result(1),)))
    decision = m.next_decision(state)
    assert isinstance(decision, m.StartTurn) and not decision.offer_tools
    # A model that asks anyway gets no call: the reply ends the run.
    state, _ = m.step(state, m.TurnCompleted(content="x", tool_calls=(call(2),)))
    assert state.phase is m.Phase.FINISHED and state.tool_calls == 1


def test_without_parallel_tool_calls_only_the_first_call_of_a_reply_runs() -> None:
    two = m.TurnCompleted(content=None, tool_calls=(call(1), call(2)))
    _, ds = m.step(m.start(spec()), two)
    assert ds == (m.CallTools(calls=(call(1),)),)
    _, ds = m.step(m.start(spec(parallel_tool_calls=True)), two)
    assert ds == (m.CallTools(calls=(call(1), call(2))),)


def test_a_round_needs_one_result_per_pending_call() -> None:
    state, _ = m.step(m.start(spec()), m.TurnCompleted(content=None, tool_calls=(call(1),)))
    with pytest.raises(ValueError, match="exactly one result"):
        m.step(state, m.ToolsReturned(results=(result(2),)))


def test_cancel_and_failure_end_the_run_and_later_events_change_nothing() -> None:
    cancelled, ds = m.step(m.start(spec()), m.Cancel(reason="cancelled"))
    assert cancelled.phase is m.Phase.CANCELLED and cancelled.error == "cancelled"
    assert isinstance(ds[0], m.RecordFinished)
    assert m.step(cancelled, m.TurnCompleted(content="late")) == (cancelled, ())
    failed, _ = m.step(m.start(spec()), m.TurnFailed(error="boom"))
    assert failed.phase is m.Phase.FAILED and m.summary(failed)["error"] == "boom"


def test_a_spec_checks_its_input() -> None:
    with pytest.raises(ValueError, match="serviceClass"):
        spec(service_class="urgent")
    with pytest.raises(ValueError, match="at least 0"):
        spec(max_tool_calls=-1)
    assert m.RunSpec.from_json(spec(tools=("lookup",)).to_json()) == spec(tools=("lookup",))


def delete(i: int) -> m.ToolCall:
    return m.ToolCall(id=f"c{i}", name="delete_record", arguments='{"record_id": "r1"}')


def test_a_call_waiting_for_approval_shows_its_tool_and_arguments_and_journals_its_turn() -> None:
    state, _ = m.step(m.start(spec()), m.TurnCompleted(content=None, tool_calls=(delete(1),)))
    state, ds = m.step(state, m.ApprovalAsked(call_id="c1"))
    assert state.phase is m.Phase.AWAITING_APPROVAL
    [record] = ds
    assert isinstance(record, m.RecordTurn) and record.round == 1 and record.asking == "c1"
    out = m.summary(state)
    assert out["state"] == "AwaitingApproval"
    assert out["pendingApproval"] == {"tool": "delete_record", "arguments": {"record_id": "r1"}}
    assert isinstance(m.next_decision(state), m.CallTools)


def test_an_answer_is_recorded_and_the_next_question_of_the_round_journals_no_second_turn() -> None:
    two = m.TurnCompleted(content=None, tool_calls=(delete(1), delete(2)))
    state, _ = m.step(m.start(spec(parallel_tool_calls=True)), two)
    state, _ = m.step(state, m.ApprovalAsked(call_id="c1"))
    state, ds = m.step(state, m.ApprovalDecided(call_id="c1", allow=False))
    assert ds == (m.RecordApproval(call_id="c1", tool="delete_record", allow=False),)
    assert state.phase is m.Phase.TOOLS and state.approval("c1") is False
    state, ds = m.step(state, m.ApprovalAsked(call_id="c2"))
    assert ds == ()
    with pytest.raises(ValueError, match="already decided"):
        m.step(state, m.ApprovalDecided(call_id="c1", allow=True))


def test_a_run_waiting_for_approval_can_be_cancelled() -> None:
    state, _ = m.step(m.start(spec()), m.TurnCompleted(content=None, tool_calls=(delete(1),)))
    state, _ = m.step(state, m.ApprovalAsked(call_id="c1"))
    state, _ = m.step(state, m.Cancel(reason="budget exceeded: seconds 3.1/3", at=5.0))
    assert state.phase is m.Phase.CANCELLED and state.ended_at == 5.0
    assert "pendingApproval" not in m.summary(state)


# --- one call at a time: sent, returned, sent again ---


def in_round(*calls: m.ToolCall) -> m.RunState:
    state = m.start(spec(parallel_tool_calls=True))
    state, _ = m.step(state, m.TurnCompleted(content="go", tool_calls=calls, usage=USAGE))
    return state


def test_the_first_send_of_a_round_journals_its_turn_with_it_and_later_sends_alone() -> None:
    state = in_round(call(1), call(2))
    state, ds = m.step(state, m.CallSending(call_id="c1", resendable=True))
    turn, sent = ds
    assert isinstance(turn, m.RecordTurn) and turn.asking is None and turn.round == 1
    assert turn.assistant["tool_calls"][1]["id"] == "c2" and turn.usage == USAGE
    assert sent == m.RecordCall(call=call(1), sent=m.Sent(call_id="c1", resendable=True))
    state, ds = m.step(state, m.CallSending(call_id="c2"))
    assert ds == (m.RecordCall(call=call(2), sent=m.Sent(call_id="c2")),)
    assert [x.call_id for x in state.sent] == ["c1", "c2"]


def test_each_result_is_journaled_as_it_arrives_and_the_last_one_completes_the_round() -> None:
    state = in_round(call(1), call(2))
    state, _ = m.step(state, m.CallSending(call_id="c1"))
    state, _ = m.step(state, m.CallSending(call_id="c2"))
    state, ds = m.step(state, m.CallReturned(result=result(2)))
    assert ds == (m.RecordResult(result=result(2)),) and state.phase is m.Phase.TOOLS
    assert state.sent_call("c2") is None and state.result_of("c2") == result(2)
    assert m.next_decision(state) == m.CallTools(calls=(call(1),))  # only what is still out
    state, ds = m.step(state, m.CallReturned(result=result(1)))
    [record] = ds
    assert isinstance(record, m.RecordRound) and record.results == (result(1), result(2))
    assert state.phase is m.Phase.RUNNING and state.sent == () and state.returned == ()
    assert state.tool_calls == 2 and not state.turn_recorded


def test_a_result_made_without_sending_journals_the_turn_before_it() -> None:
    state = in_round(call(1), call(2, name="nope"))
    refused = m.ToolResult(call_id="c2", name="nope", content="Error: no tool", ok=False)
    state, ds = m.step(state, m.CallReturned(result=refused))
    assert isinstance(ds[0], m.RecordTurn) and ds[1] == m.RecordResult(result=refused)


def test_a_call_sent_again_counts_its_sends_and_keeps_its_hints() -> None:
    state = in_round(call(1))
    state, _ = m.step(state, m.CallSending(call_id="c1", resendable=True))
    state, ds = m.step(state, m.CallSending(call_id="c1", resendable=True))
    assert ds == (
        m.RecordCall(call=call(1), sent=m.Sent(call_id="c1", attempts=2, resendable=True)),
    )


def test_a_yes_covers_one_send_so_a_call_sent_again_needs_another() -> None:
    state = in_round(call(1, name="wipe"))
    state, _ = m.step(state, m.ApprovalAsked(call_id="c1"))
    state, _ = m.step(state, m.ApprovalDecided(call_id="c1", allow=True))
    state, _ = m.step(state, m.CallSending(call_id="c1", approval=True))
    assert state.approval("c1") is None
    with pytest.raises(ValueError, match="needs the user's yes"):
        m.step(state, m.CallSending(call_id="c1", approval=True))
    state, ds = m.step(state, m.ApprovalAsked(call_id="c1"))
    assert ds == ()  # the turn is journaled already
    state, _ = m.step(state, m.ApprovalDecided(call_id="c1", allow=True))
    state, _ = m.step(state, m.CallSending(call_id="c1", approval=True))
    assert state.sent_call("c1") == m.Sent(call_id="c1", attempts=2, approval=True)


def test_an_idempotent_calls_yes_covers_its_sends_again() -> None:
    state = in_round(call(1, name="wipe"))
    state, _ = m.step(state, m.ApprovalAsked(call_id="c1"))
    state, _ = m.step(state, m.ApprovalDecided(call_id="c1", allow=True))
    state, _ = m.step(state, m.CallSending(call_id="c1", resendable=True, approval=True))
    state, _ = m.step(state, m.CallSending(call_id="c1", resendable=True, approval=True))
    assert state.approval("c1") is True and state.sent_call("c1") is not None


def test_a_call_with_its_result_is_neither_sent_nor_answered_again() -> None:
    state = in_round(call(1), call(2))
    state, _ = m.step(state, m.CallReturned(result=result(1)))
    with pytest.raises(ValueError, match="has its result already"):
        m.step(state, m.CallSending(call_id="c1"))
    with pytest.raises(ValueError, match="has its result already"):
        m.step(state, m.CallReturned(result=result(1)))
    with pytest.raises(ValueError, match="no pending tool call"):
        m.step(state, m.CallSending(call_id="c9"))


def test_cancel_mid_round_forgets_what_was_sent() -> None:
    state = in_round(call(1))
    state, _ = m.step(state, m.CallSending(call_id="c1"))
    state, _ = m.step(state, m.Cancel(reason="stop"))
    assert state.phase is m.Phase.CANCELLED and state.sent == () and state.returned == ()
