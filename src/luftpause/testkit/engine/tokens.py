"""Deterministic prompt rendering, tokenisation and prefix-block hashing.

Pure module: no I/O. A chat request is rendered into text in one fixed way (tools first, then
each message, then the generation prompt), so a conversation that grows by appending messages
renders to text that extends the previous prompt, the way a real chat template does. The text
is cut into chunks of `CHARS_PER_TOKEN` characters, each hashed to an int: that is a token.
Full blocks of tokens are keyed by a hash chain, as vLLM's prefix cache does.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

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
    head = f"<|tools|>\n{_compact(list(tools))}{END}" if tools else ""
    return head + "".join(render_message(m) for m in messages) + GENERATION_PROMPT


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


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained keys of the full blocks of `tokens`: key_i = hash(key_{i-1}, block_i)."""
    keys: list[int] = []
    key = _ROOT_HASH
    for start in range(0, len(tokens) - block_size + 1, block_size):
        key = hash((key, *tokens[start : start + block_size]))
        keys.append(key)
    return keys
