"""Keys of a conversation's opening, and the rule that sends a new run where its opening is.

Pure module: no I/O. A chat request's prompt starts with its tools and its first messages (a
system prompt, few-shot examples, a task). Runs that open alike share a prefix the engine that
served one of them may still hold, so a new run read there reads only what is its own.
`opening_keys` gives one key per opening length: a hash chained over the canonical JSON of the
tools, then of each of the first OPENING_MESSAGES messages, with the byte length it covers.
Engines render requests into tokens their own way, so a key says that two openings are the
same, not how many tokens match; the bytes it covers, times the tokens per byte learned from
usage, estimate that.

`matched_bytes` says how much of an opening a replica served lately, which both the scheduler
(`scheduler.core.cost`) and a dataplane placing a new run itself (`dataplane.local`) count as
read already there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

OPENING_MESSAGES = 4
"""Messages of a conversation's start that make up its opening keys (after its tools)."""

MAX_KEY_BYTES = 1 << 20
"""An opening past this many bytes ends the keys: a longer one is a run's own history."""

Key = tuple[int, int]
"""(hash, bytes of the opening it covers)."""


def _canonical(part: Any) -> bytes:
    return json.dumps(part, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def opening_keys(messages: Sequence[Any], tools: Any = None) -> tuple[Key, ...]:
    """The keys of a request's opening: its tools (if any), then each of its first messages."""
    parts: list[Any] = [tools] if tools else []
    parts += list(messages[:OPENING_MESSAGES])
    digest = hashlib.blake2b(digest_size=8)
    keys: list[Key] = []
    size = 0
    for part in parts:
        data = _canonical(part)
        size += len(data)
        if size > MAX_KEY_BYTES:
            break
        digest.update(len(data).to_bytes(8, "big"))  # no two splits of one text hash alike
        digest.update(data)
        keys.append((int.from_bytes(digest.copy().digest(), "big") >> 1, size))
    return tuple(keys)


def matched_bytes(keys: Iterable[Key], known: Mapping[int, Any]) -> int:
    """The bytes of the longest of `keys` in `known` (0 for none)."""
    best = 0
    for key, size in keys:
        if key in known and size > best:
            best = size
    return best
