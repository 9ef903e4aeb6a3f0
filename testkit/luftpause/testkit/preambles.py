"""What an agent puts at the start of a run's conversation: the text every run shares, then
the task (`pad`) that makes each run its own. Both load generators (`loadgen`, `mcp_loadgen`)
take their tasks from here.

Pure module: constants and deterministic text builders (`pad` draws from the generator it
is given). A base model (Gemma 3 270M, see `testkit.llamacpp`) calls tools only after it has
been shown calls in the format its chat template parses; `gemma` is that few-shot start.
`TEXT_TOOL_SYSTEM` describes a text tool protocol (calls written as `<tool_call>` blocks,
results sent back as user messages), and `shared_prefix` is a preamble of a chosen length that
every run of every agent shares.

`opening` puts them together. A run opens with at most one system message (chat templates such
as Gemma's accept a system message only as the first message): the shared text, then the text
tool protocol or the named preamble's own system text, joined by a blank line; then the rest of
the named preamble.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any


def _call(call_id: str, query: str) -> dict[str, Any]:
    arguments = json.dumps({"query": query})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "lookup", "arguments": arguments},
    }


# Few-shot examples for Gemma 3 270M, a base model: it follows the pattern it is shown.
GEMMA_PREAMBLE: list[dict[str, Any]] = [
    {
        "role": "system",
        "content": (
            "You are a research agent. To look up a fact, call the lookup tool by writing "
            '<tool_call>{"name": "lookup", "arguments": {"query": "..."}}</tool_call> and '
            "nothing else. After the tool responds, look up another fact or answer in one "
            "short sentence."
        ),
    },
    {"role": "user", "content": "Task: how long is the river Loire? Look up facts."},
    {"role": "assistant", "content": None, "tool_calls": [_call("ex-1", "length of the Loire")]},
    {"role": "tool", "tool_call_id": "ex-1", "content": "1,006 km"},
    {"role": "assistant", "content": "The Loire is 1,006 km long."},
    {
        "role": "user",
        "content": "Task: when was the town hall of Lyon built, and how tall is it? Look up facts.",
    },
    {"role": "assistant", "content": None, "tool_calls": [_call("ex-2", "Lyon town hall built")]},
    {"role": "tool", "tool_call_id": "ex-2", "content": "1651"},
    {"role": "assistant", "content": None, "tool_calls": [_call("ex-3", "Lyon town hall height")]},
    {"role": "tool", "tool_call_id": "ex-3", "content": "42 m"},
    {"role": "assistant", "content": "The town hall of Lyon was built in 1651 and is 42 m tall."},
]


def _text_call(query: str) -> str:
    return f'<tool_call>{{"name": "lookup", "arguments": {{"query": "{query}"}}}}</tool_call>'


# The same examples for the text tool protocol: calls written in the reply, results sent back
# as user messages (the protocol itself is told in the system message, `TEXT_TOOL_SYSTEM`).
GEMMA_TEXT_PREAMBLE: list[dict[str, Any]] = [
    {"role": "user", "content": "Task: how long is the river Loire? Look up facts."},
    {"role": "assistant", "content": _text_call("length of the Loire")},
    {"role": "user", "content": "<tool_response>1,006 km</tool_response>"},
    {"role": "assistant", "content": "The Loire is 1,006 km long."},
    {
        "role": "user",
        "content": "Task: when was the town hall of Lyon built, and how tall is it? Look up facts.",
    },
    {"role": "assistant", "content": _text_call("Lyon town hall built")},
    {"role": "user", "content": "<tool_response>1651</tool_response>"},
    {"role": "assistant", "content": _text_call("Lyon town hall height")},
    {"role": "user", "content": "<tool_response>42 m</tool_response>"},
    {"role": "assistant", "content": "The town hall of Lyon was built in 1651 and is 42 m tall."},
]
PREAMBLES: dict[str, list[dict[str, Any]]] = {
    "none": [],
    "gemma": GEMMA_PREAMBLE,
    "gemma-text": GEMMA_TEXT_PREAMBLE,
}
# The tool style each preamble's examples are written in.
PREAMBLE_STYLE = {"gemma": "openai", "gemma-text": "text"}

# The text tool protocol, told to the model in the system message of every run.
TEXT_TOOL_SYSTEM = (
    "You are a research agent with one tool, lookup(query), that looks up a fact. To call it, "
    'write <tool_call>{"name": "lookup", "arguments": {"query": "..."}}</tool_call> and stop. '
    "The result comes back in the next user message as <tool_response>...</tool_response>. "
    "When you know enough, answer in one short sentence without a tool call."
)

_HANDBOOK = (
    "Handbook of the research desk. Check every figure with a lookup before you state it, "
    "name the source of each fact, keep notes short, and say so when a fact cannot be found. "
)


def shared_prefix(chars: int) -> str:
    """Exactly `chars` characters of fixed handbook text (no randomness: every run shares it)."""
    return (_HANDBOOK * (chars // len(_HANDBOOK) + 1))[: max(chars, 0)]


# A block runs to its closing tag, or to the end of the text when a stop string or max_tokens
# cut the tag off (then without the part of the tag that was written); its JSON decides whether
# it is a call.
_CLOSE = "</tool_call>"
_TEXT_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def _without_cut_close(block: str) -> str:
    for n in range(len(_CLOSE) - 1, 0, -1):
        if block.endswith(_CLOSE[:n]):
            return block[:-n]
    return block


def text_tool_calls(text: str) -> tuple[list[dict[str, Any]], int]:
    """The `<tool_call>` blocks of a reply that parse as calls, and how many did not."""
    calls: list[dict[str, Any]] = []
    blocks = _TEXT_CALL.findall(text)
    for block in blocks:
        try:
            call = json.loads(_without_cut_close(block))
        except ValueError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            calls.append(call)
    return calls, len(blocks) - len(calls)


def opening(preamble: str, *, shared_chars: int, text_tools: bool) -> list[dict[str, Any]]:
    """The messages every run starts with, before its own task."""
    rest = list(PREAMBLES[preamble])
    system = [shared_prefix(shared_chars)] if shared_chars > 0 else []
    if text_tools:
        system.append(TEXT_TOOL_SYSTEM)
    if rest and rest[0]["role"] == "system":
        system.append(rest.pop(0)["content"])
    head = [{"role": "system", "content": "\n\n".join(system)}] if system else []
    return head + rest


FILLER = (
    "The river runs past the old mill and the town keeps its records in the hall. "
    "Each season the ledger grows by a page and the clerk notes the weather. "
)


def pad(rng: random.Random, chars: int) -> str:
    """A task of about `chars` characters, distinct per run so prefixes are per run."""
    head = f"Task {rng.getrandbits(48):012x}: summarise the notes below, looking up facts. "
    body = FILLER * (max(chars - len(head), 0) // len(FILLER) + 1)
    return (head + body)[: max(chars, len(head))]
