"""The one rule for sending a tool call again, and the idempotency key every call carries.

Pure module: no I/O, no clock reads; imports `values` only. The shell that sends calls
(`toolcalls`, over `upstream`) and replay (a call journaled as sent whose result never was) both
ask `after_unknown` what to do, so a call is treated the same live and after a restart.

Each time a call is sent its outcome is one of:

    ANSWERED   the tool server answered: its result, or an error it returned. Final.
    NOT_SENT   the request never left: no session, the connection was refused before a byte
               was written, or the server did not know the session (HTTP 404). Nothing ran,
               so it is sent again (on a new session) while the call's time lasts.
    UNKNOWN    it left and no answer came: a timeout, a session that broke after the request
               was written, a server error after it, or the runtime stopped between the send
               and the journaled result. The tool may or may not have acted.

After UNKNOWN (`after_unknown`):

    the tool declares idempotentHint or readOnlyHint   SEND it again, same key, while time lasts
    else, the call needed the user's approval          ASK the user again: yes SEND, no GIVE_UP
    else                                               GIVE_UP: the model reads that the call may
                                                       or may not have run

Every call carries `idempotency_key(run, call)` in its request's `_meta` under `META_KEY`, the
same on every send of that call (after a restart, an import, or a resend), so a tool server that
deduplicates by it acts once.
"""

from __future__ import annotations

from enum import StrEnum

from luftpause.runtime.core.values import Sent, ToolCall, ToolResult

META_KEY = "luftpause/idempotencyKey"
RESTARTED = "the runtime stopped while the call was in flight"


class Outcome(StrEnum):
    ANSWERED = "answered"
    NOT_SENT = "not_sent"
    UNKNOWN = "unknown"


class Next(StrEnum):
    SEND = "send"
    ASK = "ask"
    GIVE_UP = "give_up"


def idempotency_key(run: str, call_id: str) -> str:
    """The call's stable key: its run's handle and its id (a call id is its run's alone)."""
    return f"{run}/{call_id}"


def resendable(*, idempotent_hint: bool | None, read_only_hint: bool | None) -> bool:
    """A call of a tool with these annotations may be sent again when its outcome is unknown."""
    return bool(idempotent_hint) or bool(read_only_hint)


def after_unknown(sent: Sent) -> Next:
    """What to do with a sent call whose outcome is unknown, by what was known when it was sent."""
    if sent.resendable:
        return Next.SEND
    if sent.approval:
        return Next.ASK
    return Next.GIVE_UP


def unknown_result(call: ToolCall, why: str, *, declined: bool = False) -> ToolResult:
    """The result the model reads for a call that may or may not have run."""
    if declined:
        after = "The user chose not to send it again"
    else:
        after = (
            f"It was not sent again: {call.name} does not declare idempotentHint or "
            "readOnlyHint, so a second call could act twice"
        )
    text = (
        f"Error: the call to {call.name} may or may not have run ({why}). {after}; "
        "check its effect before calling it again."
    )
    return ToolResult(call_id=call.id, name=call.name, content=text, ok=False)


def spent_result(call: ToolCall, why: str, limit: float) -> ToolResult:
    """A call sent again until its time was spent: it may or may not have run."""
    text = (
        f"Error: the call to {call.name} may or may not have run: no answer within its "
        f"{limit:g} s ({why})."
    )
    return ToolResult(call_id=call.id, name=call.name, content=text, ok=False)


def unsent_result(call: ToolCall, why: str, limit: float) -> ToolResult:
    """A call that never left within its time: it did not run."""
    text = (
        f"Error: tool {call.name} could not be reached within {limit:g} s ({why}); "
        "the call was not sent."
    )
    return ToolResult(call_id=call.id, name=call.name, content=text, ok=False)
