"""Own-loop agents for load tests: tool-calling runs through any OpenAI base URL.

Shell module (network I/O through the official `openai` client). An agent runs one task to
its final answer: each reply with tool calls is answered after `tool_seconds`, and a failed
turn is retried with the same run id, as the failure table tells own-loop agents to do.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import openai
from openai import AsyncOpenAI

LOOKUP_TOOL: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


@dataclass
class RunRecord:
    run_id: str
    started: float
    ended: float = 0.0
    turns: int = 0
    retries: int = 0
    replicas: set[str] = field(default_factory=set)
    completed: bool = False


@dataclass
class AgentStats:
    runs: list[RunRecord] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


def _error_kind(exc: Exception) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"status {exc.status_code}"
    return type(exc).__name__


async def run_task(
    client: AsyncOpenAI,
    stats: AgentStats,
    *,
    run_id: str,
    model: str,
    task: str,
    headers: dict[str, str],
    tool_seconds: float = 0.05,
    max_turns: int = 12,
    max_retries: int = 20,
    retry_pause: float = 0.2,
) -> RunRecord:
    """Drive one run to its final answer (or give up after `max_retries` failed turns)."""
    record = RunRecord(run_id=run_id, started=time.monotonic())
    stats.runs.append(record)
    messages: list[Any] = [{"role": "user", "content": task}]
    extra = {**headers, "x-luftpause-run-id": run_id}
    while record.turns < max_turns and record.retries <= max_retries:
        try:
            reply = await client.chat.completions.create(
                model=model,
                messages=messages,
                tools=LOOKUP_TOOL,
                max_tokens=24,
                extra_headers=extra,
            )
        except (openai.APIError, openai.APIConnectionError) as exc:
            stats.errors[_error_kind(exc)] += 1
            record.retries += 1
            await asyncio.sleep(retry_pause)
            continue
        record.turns += 1
        record.replicas.add(reply.system_fingerprint or "?")
        message = reply.choices[0].message
        if not message.tool_calls:
            record.completed = True
            break
        messages.append(message.model_dump(exclude_none=True))
        messages += [
            {"role": "tool", "tool_call_id": call.id, "content": "42 km"}
            for call in message.tool_calls
        ]
        await asyncio.sleep(tool_seconds)
    record.ended = time.monotonic()
    return record
