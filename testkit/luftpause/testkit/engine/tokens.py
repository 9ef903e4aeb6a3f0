"""Deterministic prompt rendering, tokenisation and prefix-block hashing.

Pure module: no I/O. A chat request is rendered into text in one fixed way (tools first, then
each message, then the generation prompt), so a conversation that grows by appending messages
renders to text that extends the previous prompt, the way a real chat template does. The text
is cut into chunks of `CHARS_PER_TOKEN` characters, each hashed to an int: that is a token.
A prefix cache keys a prompt by a hash chain over its segments (`prefix_keys`): every full
block of tokens (vLLM), every message rounded down to whole blocks (a radix tree that caches
what a chat template renders per message), or nothing (no prefix cache).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

Granularity = Literal["block", "message", "none"]
GRANULARITIES: tuple[Granularity, ...] = ("block", "message", "none")

CHARS_PER_TOKEN = 4
VOCAB_SIZE = 262144
GENERATION_PROMPT = "<|assistant|>\n"
END = "<|end|>\n"
_ROOT_HASH = 0x1F2E3D4C


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_text(content: Any) -> str:
    """The text of a message's `content`: a string, a list of parts, or nothing."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content
        )
    return str(content)


def render_tool_call(name: str, arguments: str) -> str:
    return f"<tool_call>{name} {arguments}</tool_call>"


def _render_tool_calls(calls: Any) -> str:
    if not isinstance(calls, list):
        return ""
    out = []
    for call in calls:
        fn = call.get("function", {}) if isinstance(call, Mapping) else {}
        out.append(render_tool_call(str(fn.get("name", "")), str(fn.get("arguments", ""))))
    return "".join(out)


def render_message(message: Mapping[str, Any]) -> str:
    role = str(message.get("role", "user"))
    body = content_text(message.get("content")) + _render_tool_calls(message.get("tool_calls"))
    return f"<|{role}|>\n{body}{END}"


def render_prompt(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> str:
    """The prompt text of a chat request, ending with the generation prompt."""
    return render_parts(messages, tools)[0]


def render_parts(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None
) -> tuple[str, tuple[int, ...]]:
    """The prompt text, and the token index at which each of its parts (the tools, then each
    message) ends: the cuts of a message-granular prefix cache. The generation prompt follows
    the last cut; a token that straddles a cut belongs to the part after it."""
    parts = [f"<|tools|>\n{_compact(list(tools))}{END}"] if tools else []
    parts += [render_message(m) for m in messages]
    cuts: list[int] = []
    size = 0
    for part in parts:
        size += len(part)
        cuts.append(size // CHARS_PER_TOKEN)
    return "".join(parts) + GENERATION_PROMPT, tuple(cuts)


def continued(prompt_text: str, assistant_body: str) -> str:
    """The text a follow-up request starts with once this reply is part of the history."""
    return prompt_text + assistant_body + END


def tokenize(text: str) -> list[int]:
    """Token ids of `text`: each chunk of CHARS_PER_TOKEN characters hashed into the vocab."""
    step = CHARS_PER_TOKEN
    return [zlib.crc32(text[i : i + step].encode()) % VOCAB_SIZE for i in range(0, len(text), step)]


def tokenize_continuation(prompt_text: str, prompt_tokens: Sequence[int], tail: str) -> list[int]:
    """Tokens of `prompt_text + tail`, reusing the prompt's whole chunks."""
    whole = len(prompt_text) // CHARS_PER_TOKEN
    return [*prompt_tokens[:whole], *tokenize(prompt_text[whole * CHARS_PER_TOKEN :] + tail)]


def count_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def reply_cut(prompt_text: str, assistant_body: str) -> int:
    """The token index at which a reply ends once it is a message of the history."""
    return len(continued(prompt_text, assistant_body)) // CHARS_PER_TOKEN


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained keys of the full blocks of `tokens`: key_i = hash(key_{i-1}, block_i)."""
    keys: list[int] = []
    key = _ROOT_HASH
    for start in range(0, len(tokens) - block_size + 1, block_size):
        key = hash((key, *tokens[start : start + block_size]))
        keys.append(key)
    return keys


def prefix_keys(
    tokens: Sequence[int], cuts: Sequence[int], granularity: Granularity, block_size: int
) -> tuple[list[int], list[int]]:
    """The prefix-cache keys of `tokens` and, per key, the blocks the prefix up to it covers.

    `block`: one key per full block. `message`: one key per part that ends at a cut (in
    tokens), each rounded down to whole blocks (a part shorter than what rounding leaves joins
    the next). `none`: no keys, nothing is ever shared.
    """
    if granularity == "block":
        keys = block_hashes(tokens, block_size)
        return keys, list(range(1, len(keys) + 1))
    if granularity == "none":
        return [], []
    keys, ends = [], []
    key, start = _ROOT_HASH, 0
    for cut in cuts:
        end = min(cut, len(tokens)) // block_size
        if end <= start:
            continue
        key = hash((key, *tokens[start * block_size : end * block_size]))
        keys.append(key)
        ends.append(end)
        start = end
    return keys, ends
