"""The run journal's format, its incremental parser and replay.

Pure module: no I/O (the file is `journal.file`'s, the database `journal.postgres`); imports
`machine`, `forks`, `compaction` and `resend` only.
`runs.jsonl` holds one JSON object per line, each ending in a newline; every record carries the
format version `"v"`, its `type` and the run's handle `run`. This code writes format 2 and reads
formats 1 and 2 (`READS`); a runtime that reads only format 1 refuses a format-2 journal instead
of ignoring its per-call records and sending calls twice. Format 2 is format 1 (shown below with
`"v":1`) plus the `call` and `result` records, and a `turn` record before the first call of every
round with tool calls (format 1 wrote it only for a call awaiting approval):

    {"v":1,"type":"spawned","run":H,"spec":{...spawn's arguments, caller...}}
    {"v":1,"type":"round","run":H,"round":N,"assistant":{...},"results":[...],"usage":{...}}
    {"v":1,"type":"finished","run":H,"state":"finished|failed|cancelled","result":...,
     "error":...,"usage":{...},"at":T}
    {"v":1,"type":"turn","run":H,"round":N,"assistant":{...},"usage":{...},"asking":CALL}
    {"v":1,"type":"approval","run":H,"call":CALL,"tool":NAME,"allow":true|false}
    {"v":1,"type":"exceeded","run":H,"which":"tokens|toolCalls|seconds|usd","used":U,"limit":L}
    {"v":1,"type":"forked","run":H,"from":SOURCE,"round":N,"spec":{...},"history":{...},...}
    {"v":1,"type":"batch","run":H,"records":[...records that count together: one line...]}

`forked` begins a fork with its source's past (so it replays alone) and `batch` holds the
records of a fork of n runs or of an import (`bundle`) in one line; both are `forks`'.

A spawned record's spec carries `"traceparent"` (the W3C trace context of the run's
`invoke_agent` span) when the runtime traces; the field is optional in format 1 (a spec without
it reads as untraced), so a resumed run's new span can link to the trace it began in. It carries
`"key"`, the name (never the secret) of the keys file's key the run belongs to, when the runtime
has a keys file; optional likewise (a spec without it belongs to no key). It carries
`"budgetUsd"` and `"price"` (`{"input","cachedInput","output"}`, USD per million tokens of the
run's model, `price_table`) when given; optional likewise (a spec without a price costs nothing
known).
An `exceeded` record carries `"predicted"` (the next turn's predicted seconds) when a seconds
budget stopped a run before a turn it could not finish; optional likewise.

A `turn` record is written before the first of its calls is asked about, sent or answered
(format 1: only for a call that waits for the user's approval, before its first question, with
`asking` that call; in format 2 `asking` is null unless a question came first); the round record
that completes it follows later. Then, per call (format 2):

    {"v":2,"type":"call","run":H,"call":ID,"tool":NAME,"key":KEY,"attempt":N,
     "resendable":true|false,"approval":true|false}
    {"v":2,"type":"result","run":H,"call":ID,"name":NAME,"content":TEXT,"ok":B,"seconds":S}

`call` is written (and fsync'd) before the call's request leaves, each time it is sent; `key`
is the idempotency key the request carries (`resend`), `resendable` whether its tool declared
idempotentHint or readOnlyHint and `approval` whether it needed the user's yes, both as known
then, so what replay does with a call sent and never answered is decided by the journal alone
(`resend.after_unknown`). `result` is written when a call's result arrives while others of its
round are still out; the round's last result is written as the complete `round` record (which
holds every result). Replay keeps every result journaled: a restart sends only calls never sent,
and applies the rule to calls sent without a result.

    {"v":1,"type":"compacted","run":H,"rounds":[FIRST,THROUGH],"summary":TEXT|null,
     "window":W|null,"estimate":T,"usage":{...}}

A `compacted` record (the context wall, `compaction`) is written before the turn it made room
for: rounds FIRST to THROUGH (and the summary before them, if any) were replaced by the summary,
or dropped (`summary` null: truncation); `usage` is the summary call's, `window` and `estimate`
the tokens that called for it. Replay replaces the same rounds, so the summary is never made
twice. A runtime without compaction ignores the record (and replays the longer history).

A record counts once its newline is on disk: a line without one is a write torn by a crash
and is dropped, never the records before it. Replay folds the records through the state
machine (`machine.step`), so the same journal always gives the same runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from luftpause.runtime.core import compaction, forks, resend
from luftpause.runtime.core import machine as m

VERSION = 2
READS = frozenset({1, 2})  # the format versions replay understands


class JournalError(ValueError):
    """A record the runtime cannot interpret (another format version, a missing field)."""


# --- records ---


def _usage_json(u: m.Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "turns": u.turns,
        "promptTokens": u.prompt_tokens,
        "completionTokens": u.completion_tokens,
        "turnSeconds": round(u.turn_seconds, 6),
    }
    if u.cached_prompt_tokens:  # optional in format 1: records without it read as 0
        out["cachedPromptTokens"] = u.cached_prompt_tokens
    return out


def _usage(data: dict[str, Any] | None) -> m.Usage:
    data = data or {}
    return m.Usage(
        turns=int(data.get("turns", 0)),
        prompt_tokens=int(data.get("promptTokens", 0)),
        cached_prompt_tokens=int(data.get("cachedPromptTokens", 0)),
        completion_tokens=int(data.get("completionTokens", 0)),
        turn_seconds=float(data.get("turnSeconds", 0.0)),
    )


def spawned_record(spec: m.RunSpec) -> dict[str, Any]:
    return {"v": VERSION, "type": "spawned", "run": spec.handle, "spec": spec.to_json()}


def _result_json(r: m.ToolResult) -> dict[str, Any]:
    return {
        "id": r.call_id,
        "name": r.name,
        "content": r.content,
        "ok": r.ok,
        "seconds": round(r.seconds, 6),
    }


def round_record(handle: str, d: m.RecordRound) -> dict[str, Any]:
    results = [_result_json(r) for r in d.results]
    return {
        "v": VERSION,
        "type": "round",
        "run": handle,
        "round": d.round,
        "assistant": d.assistant,
        "results": results,
        "usage": _usage_json(d.usage),
    }


def finished_record(handle: str, d: m.RecordFinished) -> dict[str, Any]:
    return {
        "v": VERSION,
        "type": "finished",
        "run": handle,
        "state": d.phase.value,
        "result": d.result,
        "error": d.error,
        "usage": _usage_json(d.usage),
        "at": d.at,
    }


def turn_record(handle: str, d: m.RecordTurn) -> dict[str, Any]:
    return {
        "v": VERSION,
        "type": "turn",
        "run": handle,
        "round": d.round,
        "assistant": d.assistant,
        "usage": _usage_json(d.usage),
        "asking": d.asking,
    }


def call_record(handle: str, d: m.RecordCall) -> dict[str, Any]:
    return {
        "v": VERSION,
        "type": "call",
        "run": handle,
        "call": d.call.id,
        "tool": d.call.name,
        "key": resend.idempotency_key(handle, d.call.id),
        "attempt": d.sent.attempts,
        "resendable": d.sent.resendable,
        "approval": d.sent.approval,
    }


def result_record(handle: str, d: m.RecordResult) -> dict[str, Any]:
    body = _result_json(d.result)
    return {"v": VERSION, "type": "result", "run": handle, "call": body.pop("id"), **body}


def approval_record(handle: str, d: m.RecordApproval) -> dict[str, Any]:
    return {
        "v": VERSION,
        "type": "approval",
        "run": handle,
        "call": d.call_id,
        "tool": d.tool,
        "allow": d.allow,
    }


def exceeded_record(handle: str, d: m.RecordExceeded) -> dict[str, Any]:
    return {"v": VERSION, "type": "exceeded", "run": handle, **d.exceeded.to_json()}


def compacted_record(handle: str, d: m.RecordCompacted) -> dict[str, Any]:
    c = d.compacted
    return {
        "v": VERSION,
        "type": "compacted",
        "run": handle,
        "rounds": [d.first, c.through],
        "summary": c.summary,
        "window": c.window,
        "estimate": c.estimate,
        "usage": _usage_json(c.usage),
    }


def record_of(handle: str, d: m.Decision) -> dict[str, Any] | None:
    """The journal record a decision asks for, None for decisions that are not recorded."""
    if isinstance(d, m.RecordRound):
        return round_record(handle, d)
    if isinstance(d, m.RecordFinished):
        return finished_record(handle, d)
    if isinstance(d, m.RecordTurn):
        return turn_record(handle, d)
    if isinstance(d, m.RecordCall):
        return call_record(handle, d)
    if isinstance(d, m.RecordResult):
        return result_record(handle, d)
    if isinstance(d, m.RecordApproval):
        return approval_record(handle, d)
    if isinstance(d, m.RecordExceeded):
        return exceeded_record(handle, d)
    if isinstance(d, m.RecordCompacted):
        return compacted_record(handle, d)
    return None


def encode(record: dict[str, Any]) -> bytes:
    """One record as one line: compact JSON with no raw newline inside, then a newline."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


# --- incremental parser ---


class JournalDecoder:
    """Bytes in, records out; a line counts only once its newline arrived."""

    def __init__(self) -> None:
        self._buffer = b""
        self.skipped = 0
        self.torn = 0

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [rec for line in lines if (rec := self._parse(line)) is not None]

    def flush(self) -> list[dict[str, Any]]:
        """End of the file: whatever is left had no newline, a torn write; drop it."""
        if self._buffer:
            self.torn = len(self._buffer)
        self._buffer = b""
        return []

    def _parse(self, line: bytes) -> dict[str, Any] | None:
        if not line.strip():
            return None
        try:
            record = json.loads(line)
        except ValueError:
            # A complete line that is not JSON: only a torn write followed by a later append
            # (the store truncates torn tails, so this is damage from elsewhere); skip it.
            self.skipped += 1
            return None
        if not isinstance(record, dict):
            self.skipped += 1
            return None
        if record.get("v") not in READS:
            raise JournalError(
                f"journal record of version {record.get('v')!r}; this reads "
                + " and ".join(str(v) for v in sorted(READS))
            )
        return record


# --- replay ---


@dataclass(frozen=True, slots=True, kw_only=True)
class Replayed:
    runs: dict[str, m.RunState] = field(default_factory=dict)
    ignored: int = 0


def _calls(assistant: dict[str, Any]) -> tuple[m.ToolCall, ...]:
    return tuple(
        m.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
        for c in assistant.get("tool_calls") or []
    )


def _result(r: dict[str, Any], call_id: Any) -> m.ToolResult:
    return m.ToolResult(
        call_id=str(call_id),
        name=str(r["name"]),
        content=str(r["content"]),
        ok=bool(r.get("ok", True)),
        seconds=float(r.get("seconds", 0.0)),
    )


def _results(items: list[dict[str, Any]]) -> tuple[m.ToolResult, ...]:
    return tuple(_result(r, r["id"]) for r in items)


def apply(state: m.RunState, record: dict[str, Any]) -> m.RunState | None:
    """One record applied to its run; None if it does not fit (ignored)."""
    kind = record["type"]
    if kind == "round":
        return _apply_round(state, record)
    if kind == "turn":
        return _apply_turn(state, record)
    if kind == "call":
        return _apply_call(state, record)
    if kind == "result":
        return _apply_result(state, record)
    if kind == "approval":
        if state.phase not in (m.Phase.TOOLS, m.Phase.AWAITING_APPROVAL):
            return None
        call = str(record["call"])
        if all(c.id != call for c in state.pending) or state.approval(call) is not None:
            return None
        decided = m.ApprovalDecided(call_id=call, allow=bool(record["allow"]))
        return m.step(state, decided)[0]
    if kind == "exceeded":
        predicted = record.get("predicted")
        exceeded = m.Exceeded(
            which=str(record["which"]),
            used=float(record["used"]),
            limit=float(record["limit"]),
            predicted=None if predicted is None else float(predicted),
        )
        return m.step(state, m.BudgetExceeded(exceeded=exceeded))[0]
    if kind == "finished":
        return _apply_finished(state, record)
    if kind == "compacted":
        return _apply_compacted(state, record)
    return None


def _apply_compacted(state: m.RunState, record: dict[str, Any]) -> m.RunState | None:
    first, through = (int(n) for n in record["rounds"])
    head = len(m.start(state.spec).messages)
    verbatim = compaction.split(state.messages, head=head, rounds=state.rounds)
    if state.phase is not m.Phase.RUNNING or first != verbatim.first:
        return None
    if not verbatim.first <= through <= verbatim.last:
        return None
    summary = record.get("summary")
    window = record.get("window")
    event = m.Compacted(
        through=through,
        summary=None if summary is None else str(summary),
        usage=_usage(record.get("usage")),
        window=None if window is None else int(window),
        estimate=int(record.get("estimate") or 0),
    )
    return m.step(state, event)[0]


def _turn(record: dict[str, Any]) -> m.TurnCompleted:
    return m.TurnCompleted(
        content=record["assistant"].get("content"),
        tool_calls=_calls(record["assistant"]),
        usage=_usage(record.get("usage")),
    )


def _apply_round(state: m.RunState, record: dict[str, Any]) -> m.RunState | None:
    if int(record["round"]) != state.rounds + 1:
        return None
    if state.phase is m.Phase.RUNNING:
        state, _ = m.step(state, _turn(record))
    if state.phase is not m.Phase.TOOLS:
        return None
    results = _results(record["results"])
    if {r.call_id for r in results} != {c.id for c in state.pending}:
        return None
    state, _ = m.step(state, m.ToolsReturned(results=results))
    return state


def _apply_turn(state: m.RunState, record: dict[str, Any]) -> m.RunState | None:
    if int(record["round"]) != state.rounds + 1 or state.phase is not m.Phase.RUNNING:
        return None
    state, _ = m.step(state, _turn(record))
    if state.phase is not m.Phase.TOOLS:
        return None
    asking = record.get("asking")
    if asking is None:  # format 2: the turn came before any question
        return replace(state, turn_recorded=True)
    state, _ = m.step(state, m.ApprovalAsked(call_id=str(asking)))
    return state


def _out(state: m.RunState, call_id: str) -> bool:
    """The call is pending in the run's round and has no result yet."""
    live = state.phase in (m.Phase.TOOLS, m.Phase.AWAITING_APPROVAL)
    pending = any(c.id == call_id for c in state.pending)
    return live and pending and state.result_of(call_id) is None


def _apply_call(state: m.RunState, record: dict[str, Any]) -> m.RunState | None:
    call_id = str(record["call"])
    approval = bool(record.get("approval", False))
    if not _out(state, call_id) or (approval and state.approval(call_id) is not True):
        return None
    sending = m.CallSending(
        call_id=call_id, resendable=bool(record.get("resendable", False)), approval=approval
    )
    return m.step(state, sending)[0]


def _apply_result(state: m.RunState, record: dict[str, Any]) -> m.RunState | None:
    call_id = str(record["call"])
    if not _out(state, call_id):
        return None
    return m.step(state, m.CallReturned(result=_result(record, call_id)))[0]


def _apply_finished(state: m.RunState, record: dict[str, Any]) -> m.RunState | None:
    if state.phase.over:
        return None
    outcome = record["state"]
    at = float(record.get("at") or 0.0)
    event: m.Event
    if outcome == m.Phase.FINISHED.value:
        if state.phase is not m.Phase.RUNNING:
            return None
        event = m.TurnCompleted(
            content=record.get("result"), usage=_usage(record.get("usage")), at=at
        )
    elif outcome == m.Phase.FAILED.value:
        event = m.TurnFailed(error=str(record.get("error")), at=at)
    else:
        event = m.Cancel(reason=str(record.get("error") or "cancelled"), at=at)
    state, _ = m.step(state, event)
    return state


def replay(records: Iterable[dict[str, Any]]) -> Replayed:
    """The runs a journal describes: a pure fold of its records through the state machine."""
    runs: dict[str, m.RunState] = {}
    ignored = 0
    for record in forks.expand(records):
        try:
            handle = str(record["run"])
            if record["type"] in forks.STARTS:
                if handle in runs:
                    ignored += 1
                else:
                    runs[handle] = forks.begin(record)
                continue
            state = runs.get(handle)
            new = None if state is None else apply(state, record)
        except (KeyError, TypeError, ValueError) as exc:
            raise JournalError(f"bad journal record {record!r}: {exc}") from exc
        if new is None:
            ignored += 1
        else:
            runs[handle] = new
    return Replayed(runs=runs, ignored=ignored)
