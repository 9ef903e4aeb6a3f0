"""An agent with its own loop through luftpause, written with the OpenAI Agents SDK.

Start the local stack in one terminal (`make up`), then in another:

    .venv/bin/python examples/agents_sdk.py "How long is the Loire?"

The dataplane serves Chat Completions, not the Responses API, so the agent's model is an
`OpenAIChatCompletionsModel` on an `AsyncOpenAI` client whose base URL is the dataplane. That
client is made per run, with the run's three headers as its default headers: every turn of the
run carries the same x-luftpause-run-id, its class and its caller. The agent has one tool,
`lookup`; the simulated engines call it a few times before they answer, so the run has several
turns. Tracing is off: its exporter would send the run to OpenAI. When the run is done the agent
says so (DELETE /v1/runs/{id}) and the scheduler forgets the run at once.

--base-url and --model (or LUFTPAUSE_BASE_URL and LUFTPAUSE_MODEL) point it at another stack.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

import httpx
from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI


@function_tool
def lookup(query: str) -> str:
    """Look up a short fact."""
    return f"A short fact about {query}: it is well documented."


async def run_agent(
    task: str, *, base_url: str, model: str, key: str, headers: dict[str, str]
) -> str:
    """One run of the agent: the SDK's loop, at most 10 turns."""
    client = AsyncOpenAI(base_url=base_url, api_key=key, default_headers=headers)
    try:
        agent = Agent(
            name="researcher",
            instructions="Answer the question; use lookup for facts.",
            tools=[lookup],
            model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        )
        result = await Runner.run(
            agent, task, max_turns=10, run_config=RunConfig(tracing_disabled=True)
        )
        return str(result.final_output)
    finally:
        await client.close()


def end_run(base_url: str, run_id: str, key: str) -> None:
    """Tell the dataplane the run is over, so the scheduler forgets it now, not in 30 min."""
    auth = {"Authorization": f"Bearer {key}"}
    httpx.delete(f"{base_url}/runs/{run_id}", headers=auth, timeout=10).raise_for_status()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", nargs="?", default="How long is the Loire?")
    p.add_argument(
        "--base-url", default=os.environ.get("LUFTPAUSE_BASE_URL", "http://127.0.0.1:8080/v1")
    )
    p.add_argument("--model", default=os.environ.get("LUFTPAUSE_MODEL", "luftpause-sim"))
    p.add_argument("--run-id", default=f"agents-{uuid.uuid4().hex[:12]}", help="one per run")
    p.add_argument(
        "--class", dest="service_class", choices=("interactive", "batch"), default="interactive"
    )
    p.add_argument("--caller", default="examples", help="who is asking, for fairness")
    args = p.parse_args(argv)
    headers = {
        "x-luftpause-run-id": args.run_id,
        "x-luftpause-class": args.service_class,
        "x-luftpause-caller": args.caller,
    }
    key = os.environ.get("LUFTPAUSE_TOKEN", "luftpause")  # any key unless the stack has a token
    answer = asyncio.run(
        run_agent(args.task, base_url=args.base_url, model=args.model, key=key, headers=headers)
    )
    end_run(args.base_url, args.run_id, key)
    print(f"{args.run_id}: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
