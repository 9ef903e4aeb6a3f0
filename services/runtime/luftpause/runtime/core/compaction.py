"""The context wall: a run's history made to fit its model's context window before a turn.

Pure module: no I/O, no clock; standard library only. `wall` (the shell) asks `plan` whether
the next turn fits and, if not, what to summarise; `machine` applies the outcome (`replaced`),
so a replayed `compacted` record rebuilds the same history.

A run's messages, as this module reads them::

    head     the system message (if any) and the task: never replaced
    bridge   any messages after the head and before the first assistant message: after a
             compaction, the summary of the rounds it replaced (or the note that they were
             dropped)
    rounds   from each assistant message to the next: the message with its tool calls, its
             tool results (and a fork's instruction, if it follows them); the last one is
             round number `rounds` of the run's state, the ones before count down from it

A compaction replaces the bridge and the oldest rounds, through round `through`, with one user
message: a summary made by one model call told to keep every fact (names, numbers, decisions,
open questions), the last `keep` rounds kept verbatim; or, when no summary can be made (the call
fails, or its result still does not fit), the note that they were dropped, keeping as many of
the last rounds as fit (truncation, the emergency exit).

Estimates: the engine's count of the last turn's prompt plus its reply plus what was added since
(`Reported`), else the rendered text's bytes / `BYTES_PER_TOKEN`. A turn fits when its estimate
plus the reply it reserves (`max_tokens`) is at most the window. The estimate can be wrong; an
engine's `context_length_exceeded` (`overflow`) forces a compaction all the same.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

BYTES_PER_TOKEN = 4
MESSAGE_TOKENS = 4  # a chat template's role markers around each message
DEFAULT_KEEP_ROUNDS = 4
DEFAULT_SUMMARY_TOKENS = 1024
SUMMARY_SHARE = 4  # a summary's max_tokens is at most a quarter of the window
SUMMARY_INSTRUCTION = (
    "Summarize the conversation so far for your own later use: its older part is about to be "
    "removed from your context, and this summary replaces it. Keep every fact: names, numbers, "
    "identifiers, dates, what each tool call returned that matters, decisions made and why, "
    "and the open questions and next steps. Write it as plain notes, without preamble."
)


# --- the history's parts ---


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    """A run's messages in parts; `first` is the number of `rounds[0]`."""

    head: tuple[Message, ...]
    bridge: tuple[Message, ...]
    rounds: tuple[tuple[Message, ...], ...]
    first: int

    @property
    def last(self) -> int:
        return self.first + len(self.rounds) - 1


def split(messages: Sequence[Message], *, head: int, rounds: int) -> History:
    """`messages` in parts: `head` messages, the bridge, and rounds ending at round `rounds`."""
    starts = [i for i in range(head, len(messages)) if messages[i].get("role") == "assistant"]
    ends = [*starts[1:], len(messages)][: len(starts)]
    parts = [tuple(messages[a:b]) for a, b in zip(starts, ends, strict=True)]
    bridge_end = starts[0] if starts else len(messages)
    return History(
        head=tuple(messages[:head]),
        bridge=tuple(messages[head:bridge_end]),
        rounds=tuple(parts),
        first=rounds - len(parts) + 1,
    )


def bridge(through: int, summary: str | None) -> Message:
    """The user message that stands for rounds 1 to `through` once they are replaced."""
    if summary is None:
        text = (
            f"[Rounds 1-{through} of this conversation were dropped to fit the model's context "
            "window; what they said is lost.]"
        )
    else:
        text = (
            f"[Summary of rounds 1-{through} of this conversation, which were removed to fit the "
            f"model's context window]\n{summary}"
        )
    return {"role": "user", "content": text}


def replaced(
    messages: Sequence[Message], *, head: int, rounds: int, through: int, summary: str | None
) -> tuple[Message, ...]:
    """The messages once rounds up to `through` (and any bridge) are replaced; ValueError when
    `through` is not one of the verbatim rounds."""
    h = split(messages, head=head, rounds=rounds)
    if not h.first <= through <= h.last:
        raise ValueError(f"rounds {h.first}-{h.last} are verbatim; cannot replace to {through}")
    kept = h.rounds[through - h.first + 1 :]
    return (*h.head, bridge(through, summary), *(m for r in kept for m in r))


# --- estimates ---


def message_tokens(message: Mapping[str, Any]) -> int:
    """A message's tokens by bytes: its content, its tool calls, and the template's markers."""
    size = len(_text(message.get("content")).encode())
    calls = message.get("tool_calls")
    if calls:
        size += len(json.dumps(calls, ensure_ascii=False).encode())
    return -(-size // BYTES_PER_TOKEN) + MESSAGE_TOKENS


def text_tokens(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] = ()) -> int:
    """The prompt's tokens by bytes: the tools' JSON and every message."""
    listed = len(json.dumps(list(tools), ensure_ascii=False).encode()) if tools else 0
    return -(-listed // BYTES_PER_TOKEN) + sum(message_tokens(m) for m in messages)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content
        )
    return str(content)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reported:
    """What the engine said about a turn: its prompt and reply tokens, and the messages sent."""

    prompt_tokens: int
    completion_tokens: int
    sent: tuple[Message, ...]


def estimate(
    messages: Sequence[Message], tools: Sequence[Any], reported: Reported | None = None
) -> int:
    """The next prompt's tokens: the last report plus what came after its reply, when the
    messages still begin with what it was sent (and its reply); else by bytes."""
    if reported is not None and reported.prompt_tokens > 0:
        n = len(reported.sent)
        if len(messages) > n and tuple(messages[:n]) == reported.sent:
            added = sum(message_tokens(m) for m in messages[n + 1 :])
            return reported.prompt_tokens + reported.completion_tokens + added
    return text_tokens(messages, tools)


def fits(tokens: int, reserve: int, window: int | None) -> bool:
    return window is None or tokens + reserve <= window


# --- the plan ---


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Replace rounds up to `through` by a summary made from `request` (None: the call itself
    would not fit, only truncation is left). `whole`: it replaces every round that may go; if
    not, the summary request had to leave some out and another compaction may follow."""

    through: int
    request: tuple[Message, ...] | None
    summary_tokens: int
    whole: bool = True


def summary_tokens(window: int | None, wanted: int) -> int:
    return wanted if window is None else max(1, min(wanted, window // SUMMARY_SHARE))


def plan(
    history: History,
    tools: Sequence[Any],
    *,
    window: int | None,
    keep: int,
    wanted_summary: int = DEFAULT_SUMMARY_TOKENS,
) -> Plan | None:
    """What to summarise so the next turn may fit: every verbatim round but the last `keep`
    (at least one round goes), or as many of the oldest of them as the summary call itself
    fits with its reply; None when there is no round to replace."""
    if not history.rounds:
        return None
    may_go = len(history.rounds) - min(max(keep, 0), len(history.rounds) - 1)
    tokens = summary_tokens(window, wanted_summary)
    ask = {"role": "user", "content": SUMMARY_INSTRUCTION}
    for going in range(may_go, 0, -1):
        gone = (m for r in history.rounds[:going] for m in r)
        request = (*history.head, *history.bridge, *gone, ask)
        if fits(text_tokens(request, tools), tokens, window):
            through = history.first + going - 1
            return Plan(
                through=through, request=request, summary_tokens=tokens, whole=going == may_go
            )
    return Plan(through=history.first + may_go - 1, request=None, summary_tokens=tokens)


def truncation(
    history: History, tools: Sequence[Any], *, window: int | None, reserve: int, keep: int
) -> int | None:
    """The round to drop through so the rest fits: as many of the last rounds as fit (without a
    window, the last `keep`); at least one round goes. None when there is no round to drop."""
    if not history.rounds:
        return None
    n = len(history.rounds)
    if window is None:
        return history.first + n - min(max(keep, 0), n - 1) - 1
    note = bridge(history.last, None)
    for kept in range(n - 1, -1, -1):
        rest = (*history.head, note, *(m for r in history.rounds[n - kept :] for m in r))
        if fits(text_tokens(rest, tools), reserve, window):
            return history.last - kept
    return history.last


# --- what engines say ---

_OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_OVERFLOW_TEXT = re.compile(
    r"context[ _](?:length|size|window)|maximum context|too many tokens|prompt is too long", re.I
)
_WINDOW_TEXT = (
    re.compile(r"maximum context length is (\d+)", re.I),  # OpenAI, vLLM
    re.compile(r"context length \((\d+) tokens?\)", re.I),  # SGLang
    re.compile(r"context (?:size|window|length)(?: is| of)? \(?(\d+)", re.I),
)


def overflow(status: int, body: Any) -> tuple[bool, int | None]:
    """Whether an engine's error answer says the prompt does not fit, and the window it names."""
    if status != 400:
        return False, None
    doc: Mapping[str, Any] = body if isinstance(body, Mapping) else {}
    if isinstance(doc.get("error"), Mapping):
        doc = doc["error"]
    message = str(doc.get("message") or (body if isinstance(body, str) else ""))
    kinds = {str(doc.get("code") or ""), str(doc.get("type") or "")}
    if not (kinds & _OVERFLOW_CODES or _OVERFLOW_TEXT.search(message)):
        return False, None
    n_ctx = doc.get("n_ctx")  # llama.cpp says it as a field
    if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
        return True, n_ctx
    for pattern in _WINDOW_TEXT:
        found = pattern.search(message)
        if found:
            return True, int(found.group(1))
    return True, None


def model_window(entry: Mapping[str, Any]) -> int | None:
    """A `/v1/models` entry's context window: vLLM's and SGLang's `max_model_len`, else
    `context_length`, else llama.cpp's `meta.n_ctx_train`."""
    meta = entry.get("meta")
    for value in (
        entry.get("max_model_len"),
        entry.get("context_length"),
        meta.get("n_ctx_train") if isinstance(meta, Mapping) else None,
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
