"""`luftpause loadgen`: closed-loop own-loop agents against any OpenAI base URL.

Shell module. Each agent runs tool-calling runs back to back for the window (a finished run is
replaced at once). A run: a task padded to `--context-chars`, then turns until the model
answers without tool calls or `--tool-calls` calls are spent (then no tools are offered); each
tool call "takes" `--tool-seconds`. Turns stream, so time to first token is measured per turn;
usage (prompt and cached tokens) comes from the final usage chunk. Against the simulator the
`x-sim-tool-rounds` header makes it script exactly that many calls.

For a real base model (`--preamble gemma`, see `testkit.llamacpp`) every run's conversation
starts with the same example messages: a system message that describes the tool-call format and
two exchanges with real `tool_calls`. `--keep-tools` offers the tools on every turn and sends
`tool_choice: none` once the calls are spent, so the rendered prompt keeps its prefix (an engine
template that lists the tools up front would otherwise change the prompt's start). A base model
rarely ends its turn, so `--stop '</tool_call>'` ends a turn after its first call, and a reply
cut at `--max-tokens` (finish reason "length") ends its turn like any other: a tool call cut
short (arguments not JSON) is dropped, since no engine takes it back in the history.

`--tool-style text` runs a text tool protocol instead, as many harnesses do: requests carry no
`tools`; the system message describes the protocol (`preambles.TEXT_TOOL_SYSTEM`); the model
writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in its content, a reply a
router sees as a finished turn (finish reason "stop", no tool_calls); the agent sends the result
back as a user message `<tool_response>42 km</tool_response>`, adding "No more tool calls:
answer now." once the run's calls are spent. A block whose JSON does not parse (cut by
`--max-tokens`, say) counts as a dropped call; a reply without a call ends the run. The header
`x-sim-tool-style: text` makes the simulator script that. Text style does not combine with
`--preamble gemma` (its examples are OpenAI tool_calls) or `--keep-tools` (nothing is offered).

`--priority interactive=N,batch=M` sends each turn its class's `priority` in the request body,
as a client of a router that forwards it to engines with a priority queue would.

`--shared-prefix-chars N` opens every run of every agent with the same N characters of fixed
text, a preamble an engine can cache across runs; the task after it stays unique per run. A run
has at most one system message (Gemma's chat template, for one, takes no second): the shared
text, then the protocol text or the gemma preamble's system text, a blank line between
(`preambles.opening`).

Output: JSON with one record per run and a summary per class: runs/min (runs finished inside
the window), run time p50/p99, TTFT p50/p99, share of prompt tokens from cache, errors, and
Jain's fairness index over callers' completed runs. The command line is `loadgen_cli`'s.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import openai
from openai import AsyncOpenAI

from luftpause.testkit.agents import LOOKUP_TOOL
from luftpause.testkit.preambles import (
    PREAMBLE_STYLE,
    PREAMBLES,
    opening,
    pad,
    text_tool_calls,
)
from luftpause.testkit.stats import jain, percentile

TOOL_STYLES = ("openai", "text")
TOOL_RESULT = "42 km"
LAST_CALL_NOTE = "No more tool calls: answer now."


@dataclass
class Run:
    run_id: str
    service_class: str
    caller: str
    started: float
    ended: float = 0.0
    turns: int = 0
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    errors: int = 0
    replicas: list[str] = field(default_factory=list)
    completed: bool = False
    tool_calls: int = 0
    dropped_calls: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    base_url: str
    model: str
    interactive: int
    batch: int
    context_chars: int
    tool_calls: int
    tool_seconds: float
    window_s: float
    seed: int
    callers: int
    api_key: str = "x"
    max_tokens: int = 64
    preamble: str = "none"
    keep_tools: bool = False
    temperature: float | None = None
    stop: tuple[str, ...] = ()
    tool_style: str = "openai"
    shared_prefix_chars: int = 0
    # (class, priority) pairs: each turn sends its class's `priority` in the body (a router's
    # client that knows the class); empty sends none.
    priority: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.preamble not in PREAMBLES:
            raise ValueError(f"unknown preamble {self.preamble!r}; one of {sorted(PREAMBLES)}")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.tool_style not in TOOL_STYLES:
            raise ValueError(f"unknown tool style {self.tool_style!r}; one of {TOOL_STYLES}")
        style = PREAMBLE_STYLE.get(self.preamble, self.tool_style)
        if style != self.tool_style:
            raise ValueError(
                f"the {self.preamble} preamble's examples are in the {style} tool style, "
                f"not {self.tool_style}"
            )
        if self.tool_style == "text" and self.keep_tools:
            raise ValueError("the text tool style offers no tools to keep")
        if self.shared_prefix_chars < 0:
            raise ValueError("shared_prefix_chars must be >= 0")


async def turn(
    client: AsyncOpenAI, run: Run, wl: Workload, messages: list[Any], offer_tools: bool
) -> tuple[dict[str, Any], int] | None:
    """One streamed turn; the assistant message and its number of calls, or None if it failed."""
    headers = {
        "x-luftpause-run-id": run.run_id,
        "x-luftpause-class": run.service_class,
        "x-luftpause-caller": run.caller,
        "x-sim-tool-rounds": str(wl.tool_calls),
    }
    if wl.tool_style == "text":
        headers["x-sim-tool-style"] = "text"
        offer_tools = False  # the protocol lives in the system message
    t0 = time.monotonic()
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    kwargs: dict[str, Any] = {}
    if offer_tools:
        kwargs["tools"] = LOOKUP_TOOL
    elif wl.keep_tools:
        kwargs.update(tools=LOOKUP_TOOL, tool_choice="none")
    if wl.temperature is not None:
        kwargs["temperature"] = wl.temperature
    if wl.stop:
        kwargs["stop"] = list(wl.stop)
    priority = dict(wl.priority).get(run.service_class)
    if priority is not None:
        kwargs["extra_body"] = {"priority": priority}
    try:
        stream = await client.chat.completions.create(
            model=wl.model,
            messages=messages,
            stream=True,
            max_tokens=wl.max_tokens,
            stream_options={"include_usage": True},
            extra_headers=headers,
            **kwargs,
        )
        first = True
        async for chunk in stream:
            if chunk.usage is not None:
                run.prompt_tokens += chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                run.cached_tokens += (details.cached_tokens or 0) if details else 0
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            if choice.finish_reason:  # "length" (cut at max_tokens) is a normal end of turn
                reasons = run.finish_reasons
                reasons[choice.finish_reason] = reasons.get(choice.finish_reason, 0) + 1
            delta = choice.delta
            if first and (delta.content or delta.tool_calls):
                run.ttft_s.append(time.monotonic() - t0)
                run.replicas.append(chunk.system_fingerprint or "?")
                first = False
            content.append(delta.content or "")
            for tc in delta.tool_calls or ():
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                if tc.function is not None:
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
    except (openai.APIError, openai.APIConnectionError):
        run.errors += 1
        return None
    run.turns += 1
    if wl.tool_style == "text":
        text_calls, dropped = text_tool_calls("".join(content))
        run.dropped_calls += dropped
        return {"role": "assistant", "content": "".join(content)}, len(text_calls)
    whole = [c for c in calls.values() if _is_json(c["arguments"])]
    run.dropped_calls += len(calls) - len(whole)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if whole:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in whole
        ]
    return message, len(whole)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def answers(wl: Workload, message: dict[str, Any], calls: int, spent: int) -> list[Any]:
    """The messages that answer a turn's calls: tool messages, or one user message."""
    if wl.tool_style == "openai":
        return [
            {"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULT}
            for call in message["tool_calls"]
        ]
    text = f"<tool_response>{TOOL_RESULT}</tool_response>" * calls
    if spent >= wl.tool_calls:
        text += f"\n{LAST_CALL_NOTE}"
    return [{"role": "user", "content": text}]


async def one_run(client: AsyncOpenAI, run: Run, wl: Workload, rng: random.Random) -> None:
    messages: list[Any] = [
        *opening(
            wl.preamble, shared_chars=wl.shared_prefix_chars, text_tools=wl.tool_style == "text"
        ),
        {"role": "user", "content": pad(rng, wl.context_chars)},
    ]
    spent = 0
    while run.turns < wl.tool_calls + 4 and run.errors < 20:
        result = await turn(client, run, wl, messages, offer_tools=spent < wl.tool_calls)
        if result is None:
            await asyncio.sleep(0.5)
            continue
        message, calls = result
        messages.append(message)
        if not calls:
            run.completed = True
            break
        spent += calls
        run.tool_calls += calls
        messages += answers(wl, message, calls, spent)
        await asyncio.sleep(wl.tool_seconds)
    run.ended = time.monotonic()


async def agent(index: int, cls: str, wl: Workload, deadline: float, runs: list[Run]) -> None:
    rng = random.Random(f"{wl.seed}:{cls}:{index}")
    caller = f"caller-{index % wl.callers}"
    async with AsyncOpenAI(
        base_url=wl.base_url, api_key=wl.api_key, max_retries=0, timeout=600
    ) as client:
        n = 0
        while time.monotonic() < deadline:
            n += 1
            run = Run(
                run_id=f"{cls}-{index}-{n}-{wl.seed}",
                service_class=cls,
                caller=caller,
                started=time.monotonic(),
            )
            runs.append(run)
            await one_run(client, run, wl, rng)


def summarise(runs: list[Run], start: float, wl: Workload) -> dict[str, Any]:
    end = start + wl.window_s
    out: dict[str, Any] = {}
    for cls in ("interactive", "batch"):
        done = [r for r in runs if r.service_class == cls and r.completed and r.ended <= end]
        mine = [r for r in runs if r.service_class == cls]
        times = [r.ended - r.started for r in done]
        ttft = [t for r in mine for t in r.ttft_s]
        prompt = sum(r.prompt_tokens for r in mine)
        cached = sum(r.cached_tokens for r in mine)
        per_caller: dict[str, int] = {}
        for r in done:
            per_caller[r.caller] = per_caller.get(r.caller, 0) + 1
        out[cls] = {
            "runs_per_min": round(len(done) / (wl.window_s / 60), 2),
            "run_time_p50_s": percentile(times, 0.5),
            "run_time_p99_s": percentile(times, 0.99),
            "ttft_p50_s": percentile(ttft, 0.5),
            "ttft_p99_s": percentile(ttft, 0.99),
            "cached_share": round(cached / prompt, 4) if prompt else None,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "errors": sum(r.errors for r in mine),
            "jain_callers": jain([float(v) for v in per_caller.values()]),
            "runs_moved": sum(1 for r in mine if len(set(r.replicas)) > 1),
            "tool_calls_per_run": round(sum(r.tool_calls for r in done) / len(done), 2)
            if done
            else None,
            "turns_cut_at_max_tokens": sum(r.finish_reasons.get("length", 0) for r in mine),
        }
    return out


async def run_workload(wl: Workload) -> dict[str, Any]:
    """Run the closed loop for the window; return records and the summary."""
    start = time.monotonic()
    deadline = start + wl.window_s
    runs: list[Run] = []
    tasks = [
        asyncio.create_task(agent(i, "interactive", wl, deadline, runs))
        for i in range(wl.interactive)
    ]
    tasks += [asyncio.create_task(agent(i, "batch", wl, deadline, runs)) for i in range(wl.batch)]
    await asyncio.sleep(wl.window_s)
    for task in tasks:  # runs still going at the window's end do not count; stop them
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    summary = summarise(runs, start, wl)
    records = [
        {
            **asdict(r),
            "started": round(r.started - start, 3),
            "ended": round(r.ended - start, 3) if r.ended else None,
        }
        for r in runs
    ]
    return {"workload": asdict(wl), "summary": summary, "runs": records}
