"""Scripted replies: what the simulated model says, token by token.

Pure module: no I/O, no randomness (ids come in from the caller). The script:
- a request that offers `tools` (and does not say `tool_choice: "none"`) and holds fewer than
  `tool_rounds` messages of role `tool` gets one call to the first offered tool, its required
  parameters filled with plausible values;
- in the text tool style (a harness that parses calls out of plain text and sends results back
  as user messages), a request that holds fewer than `tool_rounds` assistant messages with a
  `<tool_call>` in their content gets the content `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>` and finish reason "stop": an ordinary text reply, as a router sees it. The tool
  is the first offered one, or `lookup` when the request offers none;
- a request whose last user message asks to "summarize the conversation" (a context wall's
  summary call, as the runtime makes one) gets notes with the first `SUMMARY_WORDS` words of
  each tool result (and of an earlier summary), cut at `max_tokens`;
- otherwise a final answer of `reply_tokens` filler words (cut at `max_tokens`). When the last
  user message lists labels ("one of: a, b, c", or several quoted strings), the answer starts
  with one of them, and logprobs of the first token rank the labels first.
Token probabilities and classifier outputs are deterministic functions of the text.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from luftpause.testkit.engine.params import ToolStyle
from luftpause.testkit.engine.tokens import CHARS_PER_TOKEN, content_text, render_tool_call

_FILLER_TEXT = (
    "the plan is to look at each step and then check the result so we can move on with "
    "a short note about what was found in the data and why it may help next time"
)
FILLER = tuple(_FILLER_TEXT.split())
_LIST_INTRO = re.compile(
    r"(?:one of|labels?|categories|classes|options|choose from|classify as)\s*[:\-]?\s*"
    r"([^\n.?!;]+)",
    re.IGNORECASE,
)
_LIST_SPLIT = re.compile(r"\s*(?:,|\||/|\bor\b)\s*")
_QUOTED = re.compile(r"[\"'`]([^\"'`\n]{1,40})[\"'`]")
TEXT_CALL_OPEN = "<tool_call>"
_LOOKUP: Mapping[str, Any] = {
    "name": "lookup",
    "parameters": {"properties": {"query": {"type": "string"}}, "required": ["query"]},
}
_SUMMARY_ASK = re.compile(r"summari[sz]e the conversation", re.IGNORECASE)
SUMMARY_WORDS = 8
_QUERIES = (
    "length of the river Loire",
    "year the old mill was built",
    "population of the town in 1900",
    "height of the town hall tower",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    @property
    def pieces(self) -> tuple[str, ...]:
        """Its tokens: an empty one that opens the call (id and name), then its arguments."""
        return ("", *_chunks(self.arguments))


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSpan:
    """The part of one tool call within a run of a reply's tokens."""

    index: int
    call: ToolCall
    opens: bool  # the run holds the call's first token (its id and name)
    text: str  # the argument text within the run


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """The scripted reply: one piece of text per generated token. A reply with tool calls is
    made of the calls' pieces one call after the other (`ToolCall.pieces`)."""

    pieces: tuple[str, ...]
    finish_reason: str
    tool_calls: tuple[ToolCall, ...] = ()
    labels: tuple[str, ...] = ()
    seed_text: str = ""

    @property
    def content(self) -> str | None:
        return None if self.tool_calls else "".join(self.pieces)

    def calls_in(self, start: int, stop: int) -> list[CallSpan]:
        """The tool calls that tokens `start` to `stop` (exclusive) are part of."""
        spans = []
        first = 0
        for index, call in enumerate(self.tool_calls):
            end = first + len(call.pieces)
            lo, hi = max(start, first), min(stop, end, len(self.pieces))
            if lo < hi:
                text = (
                    "".join(self.pieces[lo:hi]) if lo > first else "".join(self.pieces[lo + 1 : hi])
                )
                spans.append(CallSpan(index=index, call=call, opens=lo == first, text=text))
            first = end
        return spans

    def generated_calls(self) -> list[ToolCall]:
        """The tool calls as far as they were generated (a reply cut short cuts them)."""
        return [
            ToolCall(id=span.call.id, name=span.call.name, arguments=span.text)
            for span in self.calls_in(0, len(self.pieces))
        ]

    @property
    def body(self) -> str:
        """The assistant message as a follow-up request renders it."""
        if not self.tool_calls:
            return "".join(self.pieces)
        return "".join(render_tool_call(c.name, c.arguments) for c in self.generated_calls())


def _score(*parts: object) -> float:
    return (zlib.crc32("|".join(map(str, parts)).encode()) % 10007) / 10007 * 4.0


def tool_results(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "tool")


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def is_summary_request(messages: Sequence[Mapping[str, Any]]) -> bool:
    """The request asks for a summary of the conversation (the last user message says so)."""
    return bool(_SUMMARY_ASK.search(last_user_text(messages)))


def summary_reply(messages: Sequence[Mapping[str, Any]], max_tokens: int) -> Reply:
    """Notes on the conversation: the start of each tool result and of any earlier summary."""
    notes = [
        " ".join(content_text(m.get("content")).split()[:SUMMARY_WORDS])
        for m in messages
        if m.get("role") == "tool"
        or content_text(m.get("content")).startswith("[Summary of rounds")
    ]
    return text_reply(f"Notes on {len(notes)} earlier results: " + "; ".join(notes), max_tokens)


def label_candidates(text: str) -> tuple[str, ...]:
    """First words of label-like strings in `text`, in order, without repeats."""
    found: list[str] = []
    for match in _LIST_INTRO.finditer(text):
        found += [p for p in _LIST_SPLIT.split(match.group(1)) if p]
    quoted = _QUOTED.findall(text)
    if len(quoted) >= 2:
        found += quoted
    words = [w.strip("\"'`*()[] ").split()[0] for w in found if w.strip("\"'`*()[] ")]
    return tuple(dict.fromkeys(w for w in words if len(w) <= 24))[:20]


def _fill(schema: Mapping[str, Any], name: str) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "string")
    defaults: dict[str, Any] = {"integer": 1, "number": 1.0, "boolean": True, "array": []}
    if kind in defaults:
        return defaults[kind]
    if kind == "object":
        return {}
    return f"{name} for the next step"


def _tool_args(tool: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The tool's name and its required parameters, filled."""
    fn = tool.get("function", tool)
    schema = fn.get("parameters") or {}
    props = schema.get("properties") or {}
    args = {key: _fill(props.get(key) or {}, key) for key in schema.get("required") or []}
    return str(fn.get("name", "tool")), args


def _chunks(text: str) -> tuple[str, ...]:
    step = CHARS_PER_TOKEN
    return tuple(text[i : i + step] for i in range(0, len(text), step))


def calls_reply(calls: Sequence[ToolCall], max_tokens: int) -> Reply:
    """A reply made of these tool calls, cut at `max_tokens` tokens."""
    pieces = tuple(piece for call in calls for piece in call.pieces)
    cut = len(pieces) > max_tokens
    return Reply(
        pieces=pieces[:max_tokens],
        finish_reason="length" if cut else "tool_calls",
        tool_calls=tuple(calls),
    )


def text_reply(text: str, max_tokens: int) -> Reply:
    """A reply of this text, cut at `max_tokens` tokens."""
    pieces = _chunks(text)
    cut = len(pieces) > max_tokens
    return Reply(pieces=pieces[:max_tokens], finish_reason="length" if cut else "stop")


def text_calls(messages: Sequence[Mapping[str, Any]]) -> int:
    """Assistant messages that wrote a tool call as text."""
    return sum(
        1
        for m in messages
        if m.get("role") == "assistant" and TEXT_CALL_OPEN in content_text(m.get("content"))
    )


def _text_call(tools: Sequence[Mapping[str, Any]], done: int) -> str:
    name, args = _tool_args(tools[0] if tools else _LOOKUP)
    if isinstance(args.get("query"), str):
        args["query"] = _QUERIES[done % len(_QUERIES)]
    return f"{TEXT_CALL_OPEN}{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def plan_reply(
    request: Mapping[str, Any],
    *,
    tool_rounds: int,
    reply_tokens: int,
    max_tokens: int,
    call_id: str,
    tool_style: ToolStyle = "openai",
) -> Reply:
    """Script the reply to a chat request."""
    messages = request.get("messages") or []
    tools = request.get("tools") or []
    if is_summary_request(messages):
        return summary_reply(messages, max_tokens)
    if tool_style == "text" and (done := text_calls(messages)) < tool_rounds:
        return text_reply(_text_call(tools, done), max_tokens)
    if (
        tool_style == "openai"
        and tools
        and request.get("tool_choice") != "none"
        and tool_results(messages) < tool_rounds
    ):
        name, arguments = _tool_args(tools[0])
        return calls_reply(
            (ToolCall(id=call_id, name=name, arguments=json.dumps(arguments)),), max_tokens
        )
    seed = last_user_text(messages)
    labels = label_candidates(seed)
    n = min(max_tokens, reply_tokens)
    words = [FILLER[(zlib.crc32(seed.encode()) + i) % len(FILLER)] for i in range(n)]
    if labels:
        words[0] = max(labels, key=lambda w: _score(seed, 0, w))
    pieces = tuple(w if i == 0 else " " + w for i, w in enumerate(words))
    return Reply(
        pieces=pieces,
        finish_reason="length" if max_tokens < reply_tokens else "stop",
        labels=labels,
        seed_text=seed,
    )


def token_logprobs(reply: Reply, index: int, top_n: int) -> dict[str, Any]:
    """OpenAI-shaped logprobs of token `index` with its `top_n` alternatives."""
    piece = reply.pieces[index]
    space = "" if index == 0 else " "
    labels = reply.labels if index == 0 else ()
    scores = {space + w: _score(reply.seed_text, index, space + w) for w in FILLER}
    scores |= {w: _score(reply.seed_text, index, w) + 4.0 for w in labels}  # labels first
    scores.pop(piece, None)
    scores[piece] = max(scores.values(), default=0.0) + 1.5
    norm = math.log(sum(math.exp(s) for s in scores.values()))
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])[: max(top_n, 0)]
    return {
        "token": piece,
        "logprob": scores[piece] - norm,
        "bytes": list(piece.encode()),
        "top_logprobs": [
            {"token": w, "logprob": s - norm, "bytes": list(w.encode())} for w, s in ranked
        ],
    }


def classify_probs(text: str, labels: Sequence[str]) -> list[float]:
    """A deterministic probability per label for `text`."""
    scores = [_score("classify", text, label) for label in labels]
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]
