"""A script of replies: what the simulated model says at each turn of a harness's session.

Pure module: no I/O but `load_script`, which reads a file. A real harness (Claude Code, Codex)
runs its own loop against the simulator through the dataplane; with a script, the model's
replies are fixed in advance, so the harness calls the same tools in the same order every time.
The script (YAML or JSON; `luftpause fake-engine --script FILE`, or `POST /debug/script` with
the same document as JSON while it runs):

    offers: [mcp__luftpause__spawn]     # the requests it answers: those offering all of these
    replies:                            # tools (absent: every request)
      - calls:                          # a reply of tool calls, one after the other
          - name: mcp__luftpause__spawn
            arguments: {task: "Look up the Loire", tools: [lookup]}
          - name: mcp__luftpause__spawn
            arguments: {task: "Look up the Rhine", tools: [lookup]}
      - calls:
          - name: mcp__luftpause__await
            arguments: {handles: {$collect: handle}, timeout: 50}
      - text: ["The answers: ", {$collect: result}]   # a text reply, in parts
      - text: ["You said: ", {$results: true}]

Which reply a request gets: the n-th, n being the assistant messages it already holds (each
earlier reply of the model is one). Past the last reply, and for requests the script does not
answer, the simulator plans its reply as usual (`script.plan_reply`).

`{$collect: KEY}` stands for the values of KEY in the latest tool results (the `tool` messages
after the request's last assistant message): every JSON object or array found in their text,
searched through, in order, each value once. Harnesses wrap a tool's JSON in text of their own
(Codex: "Wall time: ...\\nOutput:\\n{...}"), so objects are found anywhere in it. In arguments it
is the list of values; in a text part, the values joined by "; ". `{$results: true}` in a text
part stands for the latest tool results' whole text (joined by newlines), for tools that answer
in plain text (a file read, a shell command).

The reply's tokens cost simulated time like any other reply's (4 characters a token), and its
calls stream as OpenAI deltas, one call after another.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from luftpause.testkit.engine.script import Reply, ToolCall, calls_reply, text_reply
from luftpause.testkit.engine.tokens import content_text

COLLECT = "$collect"
RESULTS = "$results"


class ScriptError(ValueError):
    """The script is malformed; the message says where."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One reply of the script: tool calls (name, arguments template), or text parts."""

    calls: tuple[tuple[str, Any], ...] = ()
    text: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Script:
    """The replies a harness's session gets, in order (see the module docstring)."""

    offers: frozenset[str] = frozenset()
    steps: tuple[Step, ...] = ()

    def applies(self, request: Mapping[str, Any]) -> bool:
        """Whether the script answers this chat request (it offers every tool named)."""
        return self.offers <= offered(request)

    def reply(
        self, request: Mapping[str, Any], *, max_tokens: int, new_id: Callable[[], str]
    ) -> Reply | None:
        """The script's reply to this chat request, or None where it says nothing."""
        if not self.applies(request):
            return None
        messages = request.get("messages") or []
        turn = sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")
        if turn >= len(self.steps):
            return None
        step = self.steps[turn]
        results = latest_results(messages)
        if step.calls:
            calls = [
                ToolCall(id=new_id(), name=name, arguments=json.dumps(fill(args, results)))
                for name, args in step.calls
            ]
            return calls_reply(calls, max_tokens)
        return text_reply("".join(_text(part, results) for part in step.text), max_tokens)


def offered(request: Mapping[str, Any]) -> frozenset[str]:
    """The names of the tools a chat request offers."""
    names = set()
    for tool in request.get("tools") or ():
        function = tool.get("function", tool) if isinstance(tool, Mapping) else {}
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return frozenset(names)


def latest_results(messages: Sequence[Any]) -> list[str]:
    """The text of the tool results after the last assistant message."""
    out: list[str] = []
    for message in reversed(messages):
        if not isinstance(message, Mapping) or message.get("role") == "assistant":
            break
        if message.get("role") == "tool":
            out.append(content_text(message.get("content")))
    return out[::-1]


def _documents(text: str) -> Iterator[Any]:
    """Every JSON object or array in `text`, outermost first, left to right."""
    decoder = json.JSONDecoder()
    i = 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
            except ValueError:
                i += 1
                continue
            yield value
            i = end
        else:
            i += 1


def _values(doc: Any, key: str) -> Iterator[Any]:
    if isinstance(doc, Mapping):
        for k, v in doc.items():
            if k == key:
                yield v
            else:
                yield from _values(v, key)
    elif isinstance(doc, list):
        for item in doc:
            yield from _values(item, key)


def collect(results: Sequence[str], key: str) -> list[Any]:
    """The values of `key` in the JSON found in `results`, in order, each once."""
    found: list[Any] = []
    for text in results:
        for doc in _documents(text):
            for value in _values(doc, key):
                if value not in found:
                    found.append(value)
    return found


def _collects(value: Any) -> str | None:
    if isinstance(value, Mapping) and set(value) == {COLLECT} and isinstance(value[COLLECT], str):
        return str(value[COLLECT])
    return None


def fill(template: Any, results: Sequence[str]) -> Any:
    """`template` with each `{$collect: KEY}` replaced by the values found."""
    key = _collects(template)
    if key is not None:
        return collect(results, key)
    if isinstance(template, Mapping):
        return {k: fill(v, results) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, results) for v in template]
    return template


def _echoes(value: Any) -> bool:
    return isinstance(value, Mapping) and dict(value) == {RESULTS: True}


def _text(part: Any, results: Sequence[str]) -> str:
    if _echoes(part):
        return "\n".join(results)
    key = _collects(part)
    if key is None:
        return str(part)
    return "; ".join(v if isinstance(v, str) else json.dumps(v) for v in collect(results, key))


def _step(raw: Any, where: str) -> Step:
    if not isinstance(raw, Mapping) or ("calls" in raw) == ("text" in raw):
        raise ScriptError(f"{where}: a reply is a mapping with either 'calls' or 'text'")
    if "text" in raw:
        parts = raw["text"] if isinstance(raw["text"], list) else [raw["text"]]
        for part in parts:
            if not isinstance(part, str) and _collects(part) is None and not _echoes(part):
                raise ScriptError(
                    f"{where}.text: parts are strings, {{$collect: KEY}} or {{$results: true}}"
                )
        return Step(text=tuple(parts))
    calls = raw["calls"]
    if not isinstance(calls, list) or not calls:
        raise ScriptError(f"{where}.calls: a non-empty list of {{name, arguments}}")
    out = []
    for i, call in enumerate(calls):
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise ScriptError(f"{where}.calls[{i}]: needs a 'name'")
        arguments = call.get("arguments", {})
        if not isinstance(arguments, Mapping):
            raise ScriptError(f"{where}.calls[{i}].arguments: must be a mapping")
        out.append((str(call["name"]), dict(arguments)))
    return Step(calls=tuple(out))


def parse_script(raw: Any) -> Script:
    """A script from its parsed document; `ScriptError` if malformed."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("replies"), list):
        raise ScriptError("a script is a mapping with a 'replies' list")
    unknown = set(raw) - {"offers", "replies"}
    if unknown:
        raise ScriptError(f"unknown keys {sorted(unknown)}")
    offers = raw.get("offers", [])
    if not isinstance(offers, list) or not all(isinstance(o, str) for o in offers):
        raise ScriptError("offers: a list of tool names")
    steps = tuple(_step(r, f"replies[{i}]") for i, r in enumerate(raw["replies"]))
    return Script(offers=frozenset(offers), steps=steps)


def load_script(path: str | Path) -> Script:
    """Read a script file (YAML, or JSON, which YAML reads too)."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ScriptError(f"cannot read script {path}: {exc}") from exc
    return parse_script(raw)
