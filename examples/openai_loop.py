"""An agent with its own loop through luftpause, written with the `openai` package.

Start the local stack in one terminal (`make up`), then in another:

    .venv/bin/python examples/openai_loop.py "How long is the Loire?"

The loop offers the model one tool, `lookup`, runs the calls the model asks for and sends the
results back until the model answers; the simulated engines call `lookup` a few times first, so
the run has several turns. Every turn carries the same x-luftpause-run-id (the run's turns go
back to the replica that holds its prefix), its class and its caller. When the run is done the
agent says so (DELETE /v1/runs/{id}) and the scheduler forgets the run at once.

--base-url and --model (or LUFTPAUSE_BASE_URL and LUFTPAUSE_MODEL) point it at another stack.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from typing import Any

import httpx
from openai import OpenAI

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a short fact.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


def lookup(query: str) -> str:
    """The tool: a canned fact, so the example needs nothing but the stack."""
    return f"A short fact about {query}: it is well documented."


def run_agent(client: OpenAI, model: str, task: str, headers: dict[str, str]) -> str:
    """One run: turns until the model answers without tool calls (at most 10)."""
    messages: list[Any] = [{"role": "user", "content": task}]
    for _ in range(10):
        reply = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, extra_headers=headers
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        calls = [c for c in message.tool_calls if c.type == "function"]
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [c.model_dump() for c in calls],
            }
        )
        for call in calls:
            args = json.loads(call.function.arguments or "{}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": lookup(**args)})
    raise RuntimeError("no answer after 10 turns")


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
    p.add_argument("--run-id", default=f"openai-{uuid.uuid4().hex[:12]}", help="one per run")
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
    with OpenAI(base_url=args.base_url, api_key=key) as client:
        answer = run_agent(client, args.model, args.task, headers)
    end_run(args.base_url, args.run_id, key)
    print(f"{args.run_id}: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
