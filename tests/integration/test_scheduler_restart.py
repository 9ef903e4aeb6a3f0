"""The scheduler dies under a flood and comes back: no client sees an error, no run moves.

Real processes: two simulated engines, a dataplane and a scheduler that the test kills with
SIGKILL and starts again with the same command line once the dataplane has seen it gone and
failed to reconnect. 40 closed-loop agents keep sending tool-calling runs through the dataplane
the whole time. Every step waits for what it needs to see (agents' replies, the dataplane's
link and log, the scheduler's status), never for a fixed time.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from luftpause.testkit.stack import SIM_MODEL, LocalStack
from luftpause.testkit.waits import eventually, read_metrics

AGENTS = 40
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
            },
        },
    }
]


@dataclass
class Agent:
    """One own-loop agent: runs back to back; after a tool call it may wait at the gate."""

    index: int
    client: AsyncOpenAI
    gate: asyncio.Event
    stop: asyncio.Event
    errors: list[str] = field(default_factory=list)
    replicas_by_run: dict[str, set[str]] = field(default_factory=dict)
    paused_on: str = ""  # the replica of the run now waiting at the gate
    waiting: bool = False  # a turn sent and not answered yet
    replies: int = 0  # turns answered
    finished: int = 0  # runs that ended with an answer

    async def run_forever(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            await self.one_run(f"agent{self.index}-run{n}")

    async def one_run(self, run_id: str) -> None:
        messages: list[Any] = [{"role": "user", "content": f"task {run_id}"}]
        seen = self.replicas_by_run.setdefault(run_id, set())
        for _ in range(6):
            self.waiting = True
            try:
                reply = await self.client.chat.completions.create(
                    model=SIM_MODEL,
                    messages=messages,
                    tools=TOOLS,
                    max_tokens=12,
                    extra_headers={
                        "x-luftpause-run-id": run_id,
                        "x-luftpause-caller": f"team{self.index % 4}",
                    },
                )
            except Exception as exc:  # any client-visible failure counts
                self.errors.append(f"{run_id}: {exc!r}")
                return
            finally:
                self.waiting = False
            self.replies += 1
            seen.add(reply.system_fingerprint or "?")
            message = reply.choices[0].message
            if not message.tool_calls:
                self.finished += 1
                return
            messages.append(message.model_dump(exclude_none=True))
            messages += [
                {"role": "tool", "tool_call_id": c.id, "content": "42"} for c in message.tool_calls
            ]
            if not self.gate.is_set():
                self.paused_on = reply.system_fingerprint or "?"
                await self.gate.wait()
                self.paused_on = ""
            await asyncio.sleep(0.05)  # the tool's own latency


async def agents_until(agents: list[Agent], ok: Callable[[Agent], bool], what: str) -> None:
    """Until every agent passes `ok`; a failure names the agents that did not."""

    async def behind() -> list[int]:
        return [a.index for a in agents if not ok(a)]

    await eventually(
        behind, lambda late: not late, f"every agent {what} (seen: the agents not yet)"
    )


async def agents_answered_since(agents: list[Agent], what: str) -> None:
    """Until every agent has had a turn answered after this call."""
    before = {a.index: a.replies for a in agents}
    await agents_until(agents, lambda a: a.replies > before[a.index], what)


async def link_up(stack: LocalStack) -> float:
    """1 while the dataplane's Report stream to the scheduler is up, else 0."""
    metrics = await read_metrics(stack.base_url.removesuffix("/v1") + "/metrics")
    return metrics["luftpause_dataplane_scheduler_link_up"]


async def link_downs(stack: LocalStack) -> int:
    """Times the dataplane logged its link down: once when it breaks, once per failed retry."""
    lines = (stack.workdir / "dataplane.log").read_text().splitlines()
    events = [json.loads(line).get("event") for line in lines if line.startswith("{")]
    return events.count("scheduler link down")


async def kill_the_scheduler(stack: LocalStack) -> None:
    """SIGKILL, then until the dataplane has seen the link go down (it holds turns from here)
    and has failed to open it again at least once (its retries are a second apart)."""
    downs = await link_downs(stack)
    await stack.procs["scheduler"].kill()
    await eventually(
        lambda: link_up(stack), lambda up: up == 0, "the dataplane to see the scheduler gone"
    )
    await eventually(
        lambda: link_downs(stack),
        lambda n: n >= downs + 2,
        "the dataplane to fail a reconnect to the dead scheduler",
    )


async def restart_the_scheduler(stack: LocalStack) -> None:
    """The same command line again, then until the dataplane is in session with it."""
    await stack.launcher.respawn("scheduler")
    await eventually(lambda: link_up(stack), lambda up: up == 1, "the dataplane back in session")


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[LocalStack]:
    async with AsyncExitStack() as exits:
        local = LocalStack(
            tmp_path,
            engine_args=("--tool-rounds", "2", "--time-scale", "10"),
            scheduler_args=("--probe-period", "0.5"),
            dataplane_args=("--id", "dp"),
        )
        await local.start(exits)
        await local.wait_healthy()
        yield local


async def test_agents_see_no_error_and_keep_their_replicas_across_a_scheduler_restart(
    stack: LocalStack,
) -> None:
    gate, stop = asyncio.Event(), asyncio.Event()
    gate.set()
    async with AsyncExitStack() as exits:
        agents = []
        for i in range(AGENTS):
            client = AsyncOpenAI(base_url=stack.base_url, api_key="x", max_retries=0, timeout=60)
            exits.push_async_callback(client.close)
            agents.append(Agent(i, client, gate, stop))
        tasks = [asyncio.create_task(a.run_forever()) for a in agents]
        try:
            async with asyncio.timeout(100):
                # 1. A restart in the middle of flowing traffic: turns are held, not failed.
                await agents_until(agents, lambda a: a.finished >= 1, "to have finished a run")
                await kill_the_scheduler(stack)
                await agents_until(agents, lambda a: a.waiting, "to be waiting on a turn")
                await restart_the_scheduler(stack)
                await agents_answered_since(agents, "to have a turn answered after the restart")

                # 2. Every agent paused on a tool, then a restart: Resync must rebuild it all.
                gate.clear()
                await agents_until(agents, lambda a: bool(a.paused_on), "to be paused on a tool")
                truth = Counter(a.paused_on for a in agents)
                await kill_the_scheduler(stack)
                await restart_the_scheduler(stack)
                status = await stack.until(
                    lambda st: sum(r["paused_interactive"] for r in st["replicas"]) == AGENTS,
                    f"the restarted scheduler to learn all {AGENTS} paused runs (Resync)",
                )
                paused = {r["id"]: r["paused_interactive"] for r in status["replicas"]}
                assert paused == dict(truth)
                assert status["turns_in_flight"] == 0
                assert all(r["in_flight"] == 0 for r in status["replicas"])
                assert status["runs"]["tool_paused"]["interactive"] == AGENTS

                # 3. The paused runs come back to their replicas.
                gate.set()
                await agents_answered_since(agents, "to have a turn answered after its pause")
                stop.set()
                await asyncio.gather(*tasks)
        finally:
            stop.set()
            gate.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    errors = [e for a in agents for e in a.errors]
    assert errors == []
    moved = {run: reps for a in agents for run, reps in a.replicas_by_run.items() if len(reps) > 1}
    assert moved == {}
    runs = sum(len(a.replicas_by_run) for a in agents)
    assert runs > AGENTS  # the agents got real work done around the outages
