"""The engine simulator's pure helpers: reply script, tokens, wire shapes (rate limits: see
test_engine_ratelimit.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pytest

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.script import (
    Reply,
    classify_probs,
    label_candidates,
    plan_reply,
    token_logprobs,
)
from luftpause.testkit.engine.tokens import (
    END,
    render_message,
    render_prompt,
    tokenize,
    tokenize_continuation,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query", "limit"],
            },
        },
    },
    {"type": "function", "function": {"name": "other", "parameters": {}}},
]


def request(tool_results: int, **extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "find the thing"}]
    for i in range(tool_results):
        messages += [
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "result"},
        ]
    return {"messages": messages, "tools": TOOLS, **extra}


def plan(req: Mapping[str, Any], *, max_tokens: int = 256, reply_tokens: int = 64) -> Reply:
    return plan_reply(
        req, tool_rounds=3, reply_tokens=reply_tokens, max_tokens=max_tokens, call_id="c"
    )


@pytest.mark.parametrize("results", [0, 1, 2])
def test_a_request_with_tools_gets_a_tool_call_while_tool_results_are_fewer_than_k(
    results: int,
) -> None:
    reply = plan(request(results))
    assert reply.finish_reason == "tool_calls"
    assert [call.name for call in reply.tool_calls] == ["lookup"]
    assert json.loads(reply.tool_calls[0].arguments) == {
        "query": "query for the next step",
        "limit": 1,
    }
    assert reply.content is None


def test_a_request_with_k_tool_results_gets_a_final_answer() -> None:
    reply = plan(request(3))
    assert not reply.tool_calls
    assert reply.finish_reason == "stop"
    assert len(reply.pieces) == 64 and reply.content


def test_tool_choice_none_gets_a_final_answer() -> None:
    reply = plan(request(0, tool_choice="none"))
    assert not reply.tool_calls


def test_max_tokens_cuts_the_answer_with_finish_reason_length() -> None:
    reply = plan(request(3), max_tokens=10)
    assert (len(reply.pieces), reply.finish_reason) == (10, "length")
    call = plan(request(0), max_tokens=3)
    assert (len(call.pieces), call.finish_reason) == (3, "length")


def test_labels_in_the_last_user_message_lead_the_first_token_and_its_logprobs() -> None:
    text = "Route this: 'the server is down'. Answer with one of: urgent, lookup, chitchat."
    assert label_candidates(text)[:3] == ("urgent", "lookup", "chitchat")
    req = {"messages": [{"role": "user", "content": text}], "logprobs": True}
    reply = plan(req, max_tokens=8, reply_tokens=8)
    assert reply.pieces[0] in ("urgent", "lookup", "chitchat")
    lp = token_logprobs(reply, 0, 5)
    top = [t["token"] for t in lp["top_logprobs"]]
    assert top[0] == reply.pieces[0] and lp["logprob"] == lp["top_logprobs"][0]["logprob"]
    assert {"urgent", "lookup", "chitchat"} <= set(top)
    assert all(t["logprob"] < 0 for t in lp["top_logprobs"])
    assert sum(math.exp(t["logprob"]) for t in lp["top_logprobs"]) <= 1.0


def test_a_growing_conversation_renders_to_text_that_extends_the_previous_prompt() -> None:
    first: list[dict[str, Any]] = [{"role": "user", "content": "hello there"}]
    text = render_prompt(first, TOOLS)
    reply = plan({"messages": first}, max_tokens=5, reply_tokens=5)
    second: list[dict[str, Any]] = [*first, {"role": "assistant", "content": reply.content}]
    second.append({"role": "user", "content": "and then?"})
    follow_up = render_prompt(second, TOOLS)
    assert follow_up.startswith(text + reply.body + END)
    assert render_message(second[1]).startswith("<|assistant|>\n")
    assert tokenize_continuation(text, tokenize(text), reply.body + END) == tokenize(
        text + reply.body + END
    )
    assert tokenize(follow_up)[: len(text) // 4] == tokenize(text)[: len(text) // 4]


def test_classifier_probabilities_are_deterministic_and_sum_to_one() -> None:
    labels = ("urgent", "lookup", "chitchat")
    probs = classify_probs("the server is down", labels)
    assert probs == classify_probs("the server is down", labels)
    assert math.isclose(sum(probs), 1.0)


def test_a_tool_call_streams_as_openai_deltas() -> None:
    reply = plan_reply(request(0), tool_rounds=3, reply_tokens=64, max_tokens=256, call_id="c1")
    env = wire.Envelope(id="chatcmpl-1", created=1, model="m", fingerprint="e")
    frames = [wire.token_chunk(env, reply, i, None) for i in range(len(reply.pieces))]
    chunks = [json.loads(f.removeprefix(b"data: ")) for f in frames]
    head = chunks[0]["choices"][0]["delta"]["tool_calls"][0]
    assert (head["id"], head["type"], head["function"]["name"]) == ("c1", "function", "lookup")
    args = "".join(
        c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks
    )
    assert json.loads(args) == json.loads(reply.tool_calls[0].arguments)
    assert all(c["system_fingerprint"] == "e" for c in chunks)
