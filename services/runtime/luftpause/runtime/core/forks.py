"""Forks: one run's past, n independent futures; and the records that begin runs.

Pure module: no I/O, no clock reads; imports `machine` only (`journal` imports it for replay).
A fork is a new run that begins where its source's last complete round ended: the source's
messages (system prompt, task, every complete round), its counters (turns, tokens, tool calls
and their seconds: what the run learned about its costs, so `maxToolCalls` and budgets go on
from there) and its spec (model, class, budgets, tools, key), with its own handle, its own
spawn time (a seconds budget counts from the fork) and, if given, its own instruction as one
more user message before its next turn. A tool call in flight at the source (its round not
complete) is not copied: the fork takes its own next turn, and its calls get their own ids,
which are the fork's alone (a call is known by its run's handle and its id, never by the id
alone). The source is not touched.

Two journal records (format 1 on, beside `journal`'s):

    {"v":1,"type":"forked","run":H,"from":SOURCE,"round":N,"spec":{...},
     "history":{"messages":[...],"toolCalls":C,"failedToolCalls":F,"toolSeconds":S,
                "usage":{...}},"instruction":TEXT|null,
     "learned":[{"usage":{...},"calls":K,"seconds":S}, ...]}

`learned` is the source's per-round samples (each complete round's turn usage, its number of
calls and its slowest call's seconds, its own source's first when it is a fork itself), the run's
learned estimates, so whatever learns from a run's rounds (`turn_samples`) knows a fork as it knew
its source; optional in format 1 (a record without it has learned nothing).
    {"v":1,"type":"batch","run":FIRST,"records":[record, ...]}

A `forked` record holds everything its run needs, so replaying (or exporting) a fork reads
nothing of its source's records. A `batch` is several records written as one line: a crash
keeps all of them or none (a fork of n runs, an import), since a line counts only once its
newline is on disk.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from luftpause.runtime.core import machine as m

VERSION = 2  # the journal's format version written (`journal.VERSION`)
MAX_FORKS = 16
STARTS = frozenset({"spawned", "forked"})  # the record types that begin a run


def instructions_for(n: int, instructions: str | list[str] | None) -> tuple[str | None, ...]:
    """Each of n forks' own instruction: none, one for all, or one each; ValueError otherwise."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FORKS:
        raise ValueError(f"n must be a whole number from 1 to {MAX_FORKS}, got {n!r}")
    if instructions is None:
        return (None,) * n
    if isinstance(instructions, str):
        return (instructions,) * n
    if len(instructions) != n:
        raise ValueError(f"instructions: {len(instructions)} given for {n} forks (one each)")
    if not all(isinstance(i, str) for i in instructions):
        raise ValueError("instructions must be strings")
    return tuple(instructions)


def history(state: m.RunState) -> dict[str, Any]:
    """The source's past a fork begins with: everything up to its last complete round."""
    return {
        "messages": list(state.messages),
        "toolCalls": state.tool_calls,
        "failedToolCalls": state.failed_tool_calls,
        "toolSeconds": state.tool_seconds,
        "usage": _usage_json(state.usage),
    }


def learned(records: Iterable[dict[str, Any]], rounds: int) -> list[dict[str, Any]]:
    """A run's per-round samples from its own records (the first `rounds` rounds)."""
    out: list[dict[str, Any]] = []
    for r in expand(records):
        if r.get("type") == "forked":
            out = list(r.get("learned") or [])[: int(r.get("round", 0))]
        elif r.get("type") == "round" and int(r.get("round", 0)) == len(out) + 1:
            results = r.get("results") or []
            seconds = max((float(x.get("seconds", 0.0)) for x in results), default=0.0)
            out.append({"usage": r.get("usage") or {}, "calls": len(results), "seconds": seconds})
    return out[:rounds]


def forked_record(
    spec: m.RunSpec,
    source: m.RunState,
    instruction: str | None = None,
    samples: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The record that begins fork `spec` from `source`'s last complete round; `samples` is
    what `turn_samples` gives for the source."""
    return {
        "v": VERSION,
        "type": "forked",
        "run": spec.handle,
        "from": source.spec.handle,
        "round": source.rounds,
        "spec": spec.to_json(),
        "history": history(source),
        "instruction": instruction,
        "learned": list(samples or []),
    }


def fork_spec(source: m.RunSpec, handle: str, at: float, **overrides: Any) -> m.RunSpec:
    """The source's spec for fork `handle`, spawned `at`; `overrides` are spec fields given
    (None means: the source's). ValueError for a field that does not fit."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(source, handle=handle, spawned_at=at, traceparent=None, **given)


def begin(record: dict[str, Any]) -> m.RunState:
    """The state a `spawned` or `forked` record begins its run in."""
    spec = m.RunSpec.from_json(record["spec"])
    if spec.handle != str(record["run"]):
        raise ValueError(f"record of run {record['run']} holds the spec of {spec.handle}")
    if record["type"] == "spawned":
        return m.start(spec)
    past = record["history"]
    messages = past["messages"]
    if not isinstance(messages, list) or not all(isinstance(x, dict) for x in messages):
        raise ValueError("a fork's history needs its messages as a list of objects")
    instruction = record.get("instruction")
    if instruction is not None:
        messages = [*messages, {"role": "user", "content": str(instruction)}]
    return m.RunState(
        spec=spec,
        messages=tuple(messages),
        rounds=int(record["round"]),
        tool_calls=int(past["toolCalls"]),
        failed_tool_calls=int(past["failedToolCalls"]),
        tool_seconds=float(past["toolSeconds"]),
        usage=_usage(past["usage"]),
    )


def batch_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Records that count together, as one journal line."""
    if not records:
        raise ValueError("a batch needs at least one record")
    return {"v": VERSION, "type": "batch", "run": records[0]["run"], "records": records}


def expand(records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The records with every batch replaced by its records (a damaged batch gives none)."""
    for record in records:
        if record.get("type") != "batch":
            yield record
            continue
        inner = record.get("records")
        if isinstance(inner, list):
            yield from (r for r in inner if isinstance(r, dict))


def _usage_json(u: m.Usage) -> dict[str, Any]:
    """A usage in the shape `journal`'s records give it."""
    return {
        "turns": u.turns,
        "promptTokens": u.prompt_tokens,
        "cachedPromptTokens": u.cached_prompt_tokens,
        "completionTokens": u.completion_tokens,
        "turnSeconds": round(u.turn_seconds, 6),
    }


def _usage(data: dict[str, Any]) -> m.Usage:
    return m.Usage(
        turns=int(data.get("turns", 0)),
        prompt_tokens=int(data.get("promptTokens", 0)),
        cached_prompt_tokens=int(data.get("cachedPromptTokens", 0)),
        completion_tokens=int(data.get("completionTokens", 0)),
        turn_seconds=float(data.get("turnSeconds", 0.0)),
    )
