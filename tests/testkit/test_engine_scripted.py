"""The simulator's script of replies: which reply a request gets, and what it collects."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.scripted import ScriptError, collect, load_script, parse_script

SCRIPT = {
    "offers": ["spawn", "await"],
    "replies": [
        {
            "calls": [
                {"name": "spawn", "arguments": {"task": "Loire"}},
                {"name": "spawn", "arguments": {"task": "Rhine"}},
            ]
        },
        {"calls": [{"name": "await", "arguments": {"handles": {"$collect": "handle"}}}]},
        {"text": ["Found: ", {"$collect": "result"}]},
    ],
}
TOOLS = [{"type": "function", "function": {"name": n}} for n in ("spawn", "await", "status")]


def ids() -> Any:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def request(*messages: dict[str, Any], tools: Any = TOOLS) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "go"}, *messages], "tools": tools}


def test_the_first_turn_gets_the_first_reply_with_all_its_calls() -> None:
    reply = parse_script(SCRIPT).reply(request(), max_tokens=500, new_id=ids())
    assert reply is not None and reply.finish_reason == "tool_calls"
    calls = [(c.id, c.name, json.loads(c.arguments)) for c in reply.tool_calls]
    assert calls == [("call_0", "spawn", {"task": "Loire"}), ("call_1", "spawn", {"task": "Rhine"})]


def test_the_next_turn_collects_the_handles_from_the_results_the_harness_wrapped() -> None:
    spawned: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a"}, {"id": "b"}],
    }
    results: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": "a", "content": 'Output:\n{"handle": "run-1"}'},
        {
            "role": "tool",
            "tool_call_id": "b",
            "content": [{"type": "text", "text": '{"handle":"run-2"}'}],
        },
    ]
    reply = parse_script(SCRIPT).reply(request(spawned, *results), max_tokens=500, new_id=ids())
    assert reply is not None
    assert json.loads(reply.tool_calls[0].arguments) == {"handles": ["run-1", "run-2"]}


def test_the_last_turn_writes_the_collected_results_into_its_text() -> None:
    turn: dict[str, Any] = {"role": "assistant", "content": None}
    awaited = json.dumps({"runs": [{"result": "1,012 km"}, {"result": "1,233 km"}]})
    messages: list[dict[str, Any]] = [
        turn,
        turn,
        {"role": "tool", "tool_call_id": "x", "content": awaited},
    ]
    reply = parse_script(SCRIPT).reply(request(*messages), max_tokens=500, new_id=ids())
    assert reply is not None and reply.content == "Found: 1,012 km; 1,233 km"
    assert reply.finish_reason == "stop"


def test_requests_it_does_not_answer_get_none() -> None:
    script = parse_script(SCRIPT)
    assert script.reply(request(tools=TOOLS[:1]), max_tokens=500, new_id=ids()) is None
    past = [{"role": "assistant", "content": "x"}] * 3
    assert script.reply(request(*past), max_tokens=500, new_id=ids()) is None


def test_collect_finds_each_value_once_in_order_anywhere_in_the_text() -> None:
    texts = ['a {"handle": "h1", "x": [{"handle": "h2"}]} b', "[1, {", '{"handle": "h1"}']
    assert collect(texts, "handle") == ["h1", "h2"]


def test_scripted_calls_stream_one_after_another_as_openai_deltas() -> None:
    reply = parse_script(SCRIPT).reply(request(), max_tokens=500, new_id=ids())
    assert reply is not None
    env = wire.Envelope(id="chatcmpl-1", created=1, model="m", fingerprint="e")
    frames = [wire.token_chunk(env, reply, i, None) for i in range(len(reply.pieces))]
    calls: dict[int, dict[str, str]] = {}
    for frame in frames:
        for call in json.loads(frame.removeprefix(b"data: "))["choices"][0]["delta"]["tool_calls"]:
            entry = calls.setdefault(call["index"], {"id": call.get("id", ""), "arguments": ""})
            entry["arguments"] += call["function"]["arguments"]
    assert [(c["id"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("call_0", {"task": "Loire"}),
        ("call_1", {"task": "Rhine"}),
    ]


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ([], "replies"),
        ({"replies": [{}]}, "calls' or 'text'"),
        ({"replies": [{"calls": []}]}, "non-empty"),
        ({"replies": [{"calls": [{"arguments": {}}]}]}, "name"),
        ({"replies": [{"text": [3]}]}, "parts"),
        ({"replies": [], "turns": 3}, "unknown keys"),
    ],
)
def test_a_malformed_script_says_where(raw: Any, says: str) -> None:
    with pytest.raises(ScriptError, match=says):
        parse_script(raw)


def test_a_script_file_is_yaml(tmp_path: Path) -> None:
    path = tmp_path / "session.yaml"
    path.write_text("replies:\n  - text: done\n")
    assert load_script(path).steps[0].text == ("done",)
