"""An agent with its own loop through luftpause, written with LangGraph.

Start the local stack in one terminal (`make up`), then in another:

    .venv/bin/python examples/langgraph_agent.py "How long is the Loire?"

The graph is the usual tool loop: a model node (`ChatOpenAI` with the dataplane as its base URL)
and a tool node with one tool, `lookup`, until the model answers without tool calls; the
simulated engines call `lookup` a few times first, so the run has several turns. The model is
made per run, with the run's three headers as its default headers: every turn of the run
carries the same x-luftpause-run-id, its class and its caller. When the run is done the agent
says so (DELETE /v1/runs/{id}) and the scheduler forgets the run at once.

--base-url and --model (or LUFTPAUSE_BASE_URL and LUFTPAUSE_MODEL) point it at another stack.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from typing import Any

import httpx
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import SecretStr


@tool
def lookup(query: str) -> str:
    """Look up a short fact."""
    return f"A short fact about {query}: it is well documented."


def build_graph(llm: ChatOpenAI) -> Any:
    """model -> tools -> model ... until a reply without tool calls."""
    model = llm.bind_tools([lookup])

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def run_agent(task: str, *, base_url: str, model: str, key: str, headers: dict[str, str]) -> str:
    """One run of the graph (at most 10 model turns)."""
    llm = ChatOpenAI(
        model=model, base_url=base_url, api_key=SecretStr(key), default_headers=headers
    )
    out = build_graph(llm).invoke({"messages": [("user", task)]}, {"recursion_limit": 20})
    return str(out["messages"][-1].content)


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
    p.add_argument("--run-id", default=f"langgraph-{uuid.uuid4().hex[:12]}", help="one per run")
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
    answer = run_agent(
        args.task, base_url=args.base_url, model=args.model, key=key, headers=headers
    )
    end_run(args.base_url, args.run_id, key)
    print(f"{args.run_id}: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
