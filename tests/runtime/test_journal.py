"""The journal: its incremental parser (torn lines), replay, and the golden journals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m
from luftpause.runtime.core import resend
from luftpause.runtime.journal.file import JournalFile
from tests.runtime.make_golden import GOLDEN, expected

SPEC = m.RunSpec(handle="run-1", task="rivers", model="sim")


def lines(*records: dict[str, object]) -> bytes:
    return b"".join(j.encode(r) for r in records)


def round_record(n: int) -> dict[str, object]:
    call = m.ToolCall(id=f"c{n}", name="lookup", arguments="{}")
    d = m.RecordRound(
        round=n,
        assistant=m.assistant_message(None, (call,)),
        results=(m.ToolResult(call_id=f"c{n}", name="lookup", content="r"),),
        usage=m.Usage(turns=1, prompt_tokens=5),
    )
    return j.round_record("run-1", d)


def test_every_record_is_one_versioned_line_with_a_run_id() -> None:
    data = j.encode(j.spawned_record(SPEC))
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    record = json.loads(data)
    assert record["v"] == 2 and record["run"] == "run-1" and record["type"] == "spawned"


def test_records_fed_a_byte_at_a_time_come_out_whole() -> None:
    data = lines(j.spawned_record(SPEC), round_record(1))
    decoder = j.JournalDecoder()
    out = [rec for i in range(len(data)) for rec in decoder.feed(data[i : i + 1])]
    assert out + decoder.flush() == [j.spawned_record(SPEC), round_record(1)]


def test_a_torn_last_line_is_dropped_without_losing_the_records_before_it() -> None:
    data = lines(j.spawned_record(SPEC), round_record(1)) + j.encode(round_record(2))[:-9]
    decoder = j.JournalDecoder()
    records = decoder.feed(data) + decoder.flush()
    assert records == [j.spawned_record(SPEC), round_record(1)]
    assert decoder.torn > 0


def test_a_damaged_line_in_the_middle_is_skipped() -> None:
    data = lines(j.spawned_record(SPEC)) + b'{"v":1,"ty\n' + lines(round_record(1))
    decoder = j.JournalDecoder()
    assert len(decoder.feed(data)) == 2 and decoder.skipped == 1


def test_a_record_of_another_format_version_is_refused() -> None:
    with pytest.raises(j.JournalError, match="version 3; this reads 1 and 2"):
        j.JournalDecoder().feed(b'{"v":3,"type":"spawned","run":"x"}\n')


def test_replay_rebuilds_an_unfinished_run_at_its_last_complete_round() -> None:
    state = j.replay([j.spawned_record(SPEC), round_record(1), round_record(2)]).runs["run-1"]
    assert state.phase is m.Phase.RUNNING and state.rounds == 2
    assert [msg["role"] for msg in state.messages] == ["user", "assistant", "tool"] * 1 + [
        "assistant",
        "tool",
    ]
    assert state.usage.prompt_tokens == 10
    assert isinstance(m.next_decision(state), m.StartTurn)


def test_replay_ignores_a_repeated_round_and_records_of_unknown_runs() -> None:
    replayed = j.replay(
        [j.spawned_record(SPEC), round_record(1), round_record(1), {**round_record(1), "run": "x"}]
    )
    assert replayed.runs["run-1"].rounds == 1 and replayed.ignored == 2


def test_replay_of_a_finished_run_keeps_its_result_and_ignores_later_records() -> None:
    finished = j.finished_record(
        "run-1", m.RecordFinished(phase=m.Phase.FINISHED, result="done", error=None)
    )
    replayed = j.replay([j.spawned_record(SPEC), round_record(1), finished, round_record(2)])
    state = replayed.runs["run-1"]
    assert (state.phase, state.result, state.tool_calls) == (m.Phase.FINISHED, "done", 1)
    assert replayed.ignored == 1


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.jsonl")), ids=lambda p: p.stem)
def test_replay_of_a_golden_journal_gives_the_recorded_state(path: Path) -> None:
    recorded = json.loads(path.with_suffix(".state.json").read_text())
    assert expected(path) == recorded


def test_replay_is_the_same_every_time() -> None:
    path = GOLDEN / "tree_with_torn_tail.jsonl"
    assert expected(path) == expected(path)


async def test_opening_a_journal_cuts_a_torn_tail_so_the_next_record_starts_a_clean_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_bytes(lines(j.spawned_record(SPEC)) + j.encode(round_record(1))[:20])
    store = JournalFile(tmp_path)
    assert store.open() == [j.spawned_record(SPEC)]
    await store.append(round_record(1))
    store.close()
    again = JournalFile(tmp_path)
    assert again.open() == [j.spawned_record(SPEC), round_record(1)]
    again.close()


DELETE = m.ToolCall(id="d1", name="delete_record", arguments='{"record_id": "r1"}')


def approval_journal(*, answered: bool) -> list[dict[str, object]]:
    """A run that asked about delete_record; answered (declined) or not before a restart."""
    state, _ = m.step(m.start(SPEC), m.TurnCompleted(content=None, tool_calls=(DELETE,)))
    state, [turn] = m.step(state, m.ApprovalAsked(call_id="d1"))
    records = [j.spawned_record(SPEC), j.record_of("run-1", turn)]
    if answered:
        _, [decided] = m.step(state, m.ApprovalDecided(call_id="d1", allow=False))
        records.append(j.record_of("run-1", decided))
    return [r for r in records if r is not None]


def test_an_approval_answered_before_a_restart_is_replayed_and_not_asked_again() -> None:
    state = j.replay(approval_journal(answered=True)).runs["run-1"]
    assert state.phase is m.Phase.TOOLS and state.pending == (DELETE,)
    assert state.approval("d1") is False


def test_an_unanswered_approval_is_replayed_as_waiting_so_it_is_asked_again() -> None:
    state = j.replay(approval_journal(answered=False)).runs["run-1"]
    assert state.phase is m.Phase.AWAITING_APPROVAL and state.approval("d1") is None
    assert m.summary(state)["pendingApproval"]["tool"] == "delete_record"
    assert m.step(state, m.ApprovalAsked(call_id="d1")) == (state, ())


def test_the_round_after_an_approval_completes_the_journaled_turn() -> None:
    records = approval_journal(answered=True)
    declined = m.ToolResult(call_id="d1", name="delete_record", content="Error: no", ok=False)
    assistant = m.assistant_message(None, (DELETE,))
    d = m.RecordRound(round=1, assistant=assistant, results=(declined,), usage=m.Usage())
    state = j.replay([*records, j.round_record("run-1", d)]).runs["run-1"]
    assert state.phase is m.Phase.RUNNING and state.failed_tool_calls == 1
    assert state.approvals == () and not state.turn_recorded


def test_a_tripped_budget_and_the_cancel_it_caused_replay_to_the_same_state() -> None:
    spec = m.RunSpec(handle="run-1", task="t", model="sim", budget_tool_calls=0)
    exceeded = m.Exceeded(which="toolCalls", used=1, limit=0)
    records = [
        j.spawned_record(spec),
        round_record(1),
        j.exceeded_record("run-1", m.RecordExceeded(exceeded=exceeded)),
        j.finished_record(
            "run-1",
            m.RecordFinished(phase=m.Phase.CANCELLED, result=None, error=exceeded.reason, at=9.0),
        ),
    ]
    state = j.replay(records).runs["run-1"]
    assert state.exceeded == exceeded and state.phase is m.Phase.CANCELLED
    assert state.error == "budget exceeded: toolCalls 1/0" and state.ended_at == 9.0
    assert m.RunSpec.from_json(spec.to_json()) == spec


# --- per-call records (format 2) and the format-1 journals written before them ---


def golden_runs(name: str) -> dict[str, m.RunState]:
    decoder = j.JournalDecoder()
    records = decoder.feed((GOLDEN / name).read_bytes()) + decoder.flush()
    return j.replay(records).runs


def test_calls_sent_and_never_answered_replay_to_what_the_rule_does_with_them() -> None:
    runs = golden_runs("calls_sent_and_never_answered.jsonl")
    decided = {h: resend.after_unknown(sent) for h, s in runs.items() for sent in s.sent}
    assert decided == {
        "run-charge": resend.Next.GIVE_UP,  # charge: neither idempotent nor read-only
        "run-status": resend.Next.SEND,  # set_status: idempotentHint
        "run-delete": resend.Next.ASK,  # delete_record: approved once, asked again
    }
    unsent = runs["run-unsent"]
    assert unsent.sent == () and unsent.phase is m.Phase.AWAITING_APPROVAL  # sent on its yes
    assert all(s.turn_recorded for s in runs.values())  # resuming writes no second turn


def test_a_result_that_arrived_is_kept_and_only_the_call_still_out_is_left() -> None:
    both = golden_runs("a_parallel_round_keeps_each_result.jsonl")["run-both"]
    assert [r.content for r in both.returned] == ["found a"]
    assert m.next_decision(both) == m.CallTools(calls=(both.pending[1],))
    assert both.sent_call("call_b") == m.Sent(call_id="call_b")


def test_a_torn_result_leaves_its_call_sent_and_unanswered() -> None:
    torn = golden_runs("a_torn_result_after_its_call.jsonl")["run-torn"]
    assert torn.returned == () and resend.after_unknown(torn.sent[0]) is resend.Next.GIVE_UP


def test_a_format_1_journal_written_before_per_call_records_replays_and_goes_on() -> None:
    runs = golden_runs("format1_from_the_code_before_per_call_records.jsonl")
    assert {h: s.phase for h, s in runs.items()} == {
        "run-v1-done": m.Phase.FINISHED,
        "run-v1-asked": m.Phase.AWAITING_APPROVAL,
        "run-v1-slow": m.Phase.FINISHED,
        "run-v1-waiting": m.Phase.AWAITING_APPROVAL,
    }
    asked = runs["run-v1-asked"]
    assert asked.rounds == 1 and asked.turn_recorded and asked.sent == ()
    # Going on: the answer, the send and the round are written in format 2 after it.
    call_id = asked.pending[0].id
    state, _ = m.step(asked, m.ApprovalDecided(call_id=call_id, allow=True))
    state, ds = m.step(state, m.CallSending(call_id=call_id, approval=True))
    [record] = [j.record_of("run-v1-asked", d) for d in ds]
    assert record is not None and record["v"] == 2 and record["type"] == "call"
    assert record["key"] == f"run-v1-asked/{call_id}"


def test_a_call_record_replays_only_onto_a_call_still_out_in_its_round() -> None:
    state = m.start(SPEC)
    call = m.ToolCall(id="c1", name="lookup", arguments="{}")
    state, _ = m.step(state, m.TurnCompleted(content=None, tool_calls=(call,)))
    records = [j.spawned_record(SPEC)]
    _, ds = m.step(state, m.CallSending(call_id="c1", resendable=True))
    records += [r for d in ds if (r := j.record_of("run-1", d)) is not None]
    stray = {**records[-1], "call": "c9"}
    approved = {**records[-1], "approval": True}  # no yes was journaled for it
    replayed = j.replay([*records, stray, approved])
    assert replayed.ignored == 2 and replayed.runs["run-1"].sent_call("c1") is not None
