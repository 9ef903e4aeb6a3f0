"""The rate-limit benchmark's agents: one tool-calling task each, through the official client.

Shell module (network I/O through `openai.AsyncOpenAI`). An agent follows its `AgentPlan`: it
waits its start time, sends its task with the lookup tool offered, answers each tool call after
the round's tool time with a result of the round's size, and on its last turn keeps the tool
offered with `tool_choice: none`, so the model answers (and the prompt keeps its prefix). Turns
stream; a turn's latency runs from the call until the stream's end, its time to first byte until
the first chunk, both including every retry the client made.

The client retries as the `openai` package does (`max_retries`: its default 2, or the patient
arm's 30; honouring `retry-after-ms` and `Retry-After` up to a minute, else its own backoff);
every 429 a client saw is counted through an httpx response hook. A turn that still fails
after the client's retries is a client-visible error: the agent sends it again after a second,
at most `AGAIN` times, so every arm does the same work whenever it can.

With several base URLs (two providers, straight at them), each turn goes where a `BudgetSplit`
shared by all agents sends it: in proportion to each provider's budget.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2  # the openai package's transport
import openai
from openai import AsyncOpenAI

from bench.ratelimit_plan import OPENAI_DEFAULT_RETRIES, AgentPlan, split_pick, text
from luftpause.testkit.agents import LOOKUP_TOOL

AGAIN = 5  # times an agent sends a turn again after the client gave up on it


@dataclass
class Turn:
    """One turn as its agent saw it; times in real seconds from the run's start."""

    agent: int
    index: int
    started_s: float
    latency_s: float = 0.0
    ttfb_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    provider: str = ""
    ok: bool = False
    refused_seen: int = 0  # 429s the client saw (and retried) for this turn
    errors: list[str] = field(default_factory=list)


class BudgetSplit:
    """Which base URL each next turn goes to: smooth weighted round robin over the providers'
    budgets (`ratelimit_plan.split_pick`), shared by every agent of an arm."""

    def __init__(self, weights: Sequence[int]) -> None:
        self.weights = tuple(weights)
        self._credit: tuple[float, ...] = (0.0,) * len(self.weights)

    def next(self) -> int:
        chosen, self._credit = split_pick(self._credit, self.weights)
        return chosen


class Client:
    """An AsyncOpenAI client of `base_url` (with /v1) that counts the 429s its transport sees."""

    def __init__(self, base_url: str, max_retries: int = OPENAI_DEFAULT_RETRIES) -> None:
        self.seen_429 = 0
        # The openai package's own transport defaults (its httpx, timeout and limits), with a
        # response hook.
        http = openai.DefaultAsyncHttpxClient(event_hooks={"response": [self._on_response]})
        self.api = AsyncOpenAI(
            base_url=base_url, api_key="x", max_retries=max_retries, http_client=http
        )

    async def _on_response(self, response: Any) -> None:
        if response.status_code == 429:
            self.seen_429 += 1

    async def close(self) -> None:
        await self.api.close()


async def run_agent(
    plan: AgentPlan,
    clients: list[Client],
    split: BudgetSplit | None,
    *,
    model: str,
    seed: int,
    time_scale: float,
    max_tokens: int,
    t0: float,
) -> list[Turn]:
    """Drive the agent's task to its final answer; its turns, in order."""
    await asyncio.sleep(plan.start_s / time_scale)
    tag = f"{seed}/{plan.agent}"
    messages: list[Any] = [{"role": "user", "content": text(f"task {tag}", plan.task_tokens)}]
    headers = {"x-luftpause-run-id": f"ratelimit-{seed}-{plan.agent}"}
    turns: list[Turn] = []
    for k in range(plan.turns):
        last = k == len(plan.rounds)
        client = clients[split.next() if split is not None else 0]
        turn = Turn(agent=plan.agent, index=k, started_s=time.perf_counter() - t0)
        turns.append(turn)
        reply = None
        for _ in range(AGAIN + 1):
            seen = client.seen_429
            try:
                reply = await _one_turn(
                    client.api, turn, model, messages, headers, max_tokens, "none" if last else None
                )
            except (openai.APIError, httpx2.HTTPError) as exc:
                turn.errors.append(_kind(exc))
                await asyncio.sleep(1.0)
                continue
            finally:
                turn.refused_seen += client.seen_429 - seen
            break
        turn.latency_s = time.perf_counter() - t0 - turn.started_s
        if reply is None:
            return turns  # the task cannot go on without this turn's reply
        turn.ok = True
        if last or not reply.get("tool_calls"):
            return turns
        messages.append(reply)
        result = text(f"result {tag}/{k}", plan.rounds[k].result_tokens)
        calls = reply["tool_calls"]
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": result} for c in calls]
        await asyncio.sleep(plan.rounds[k].tool_s / time_scale)
    return turns


async def _one_turn(
    api: AsyncOpenAI,
    turn: Turn,
    model: str,
    messages: list[Any],
    headers: dict[str, str],
    max_tokens: int,
    tool_choice: str | None,
) -> dict[str, Any]:
    """One streamed call; fills the turn's usage, provider and time to first byte, and returns
    the assistant message to append."""
    sent = time.perf_counter()
    extra: dict[str, Any] = {"tool_choice": tool_choice} if tool_choice else {}
    stream = await api.chat.completions.create(
        model=model,
        messages=messages,
        tools=LOOKUP_TOOL,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers,
        **extra,
    )
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in stream:
        if turn.ttfb_s is None:
            turn.ttfb_s = time.perf_counter() - sent
        if chunk.system_fingerprint and not turn.provider:
            turn.provider = chunk.system_fingerprint
        if chunk.usage is not None:
            turn.prompt_tokens = chunk.usage.prompt_tokens
            turn.completion_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                content.append(delta.content)
            for call in delta.tool_calls or ():
                slot = calls.setdefault(
                    call.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                slot["id"] = call.id or slot["id"]
                if call.function is not None:
                    slot["function"]["name"] += call.function.name or ""
                    slot["function"]["arguments"] += call.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def _kind(exc: Exception) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"status {exc.status_code}"
    return type(exc).__name__
