"""The one rule for sending a tool call again: pure, no event loop."""

from __future__ import annotations

import pytest

from luftpause.runtime.core import machine as m
from luftpause.runtime.core import resend
from luftpause.runtime.core.resend import Next

CALL = m.ToolCall(id="c1", name="charge", arguments="{}")


@pytest.mark.parametrize(
    ("idempotent", "read_only", "approval", "expected"),
    [
        (True, None, False, Next.SEND),
        (None, True, False, Next.SEND),
        (True, False, True, Next.SEND),  # an idempotent call needs no second yes
        (False, False, True, Next.ASK),
        (None, None, True, Next.ASK),
        (False, False, False, Next.GIVE_UP),
        (None, None, False, Next.GIVE_UP),
    ],
)
def test_an_unknown_outcome_is_sent_again_only_for_an_idempotent_or_read_only_tool(
    idempotent: bool | None, read_only: bool | None, approval: bool, expected: Next
) -> None:
    again = resend.resendable(idempotent_hint=idempotent, read_only_hint=read_only)
    sent = m.Sent(call_id="c1", resendable=again, approval=approval)
    assert resend.after_unknown(sent) is expected


def test_the_idempotency_key_is_the_runs_handle_and_the_calls_id() -> None:
    assert resend.idempotency_key("run-1", "call_7") == "run-1/call_7"
    assert resend.idempotency_key("run-1", "c") != resend.idempotency_key("run-2", "c")


def test_the_model_reads_that_an_unknown_call_may_or_may_not_have_run_and_why() -> None:
    told = resend.unknown_result(CALL, "no answer in time")
    assert not told.ok and told.call_id == "c1" and told.name == "charge"
    assert "may or may not have run (no answer in time)" in told.content
    assert "does not declare idempotentHint or readOnlyHint" in told.content
    declined = resend.unknown_result(CALL, "x", declined=True)
    assert "The user chose not to send it again" in declined.content


def test_a_call_that_never_left_says_it_was_not_sent_and_one_out_of_time_that_it_may_have_run() -> (
    None
):
    unsent = resend.unsent_result(CALL, "no session", 300)
    assert "could not be reached within 300 s" in unsent.content and "not sent" in unsent.content
    spent = resend.spent_result(CALL, "no answer in time", 2.5)
    assert "may or may not have run: no answer within its 2.5 s" in spent.content


def test_a_sent_call_checks_its_input() -> None:
    with pytest.raises(ValueError):
        m.Sent(call_id="c1", attempts=0)
    with pytest.raises(ValueError):
        m.Sent(call_id="")
