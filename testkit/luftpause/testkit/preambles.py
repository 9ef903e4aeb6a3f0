"""Messages an agent puts at the start of every run's conversation, by name.

A base model (Gemma 3 270M, see bench/real_pool.py) calls tools only after it has been shown
calls in the format its chat template parses; `gemma` is that few-shot start.
"""

from __future__ import annotations

import json
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
PREAMBLES: dict[str, list[dict[str, Any]]] = {"none": [], "gemma": GEMMA_PREAMBLE}
