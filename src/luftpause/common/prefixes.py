"""Keys of a conversation's opening, and the rule that sends a new run where its opening is.

Pure module: no I/O. A chat request's prompt starts with its tools and its first messages (a
system prompt, few-shot examples, a task). Runs that open alike share a prefix the engine that
served one of them may still hold, so a new run read there reads only what is its own.
`opening_keys` gives one key per opening length: a hash chained over the canonical JSON of the
tools, then of each of the first OPENING_MESSAGES messages, with the byte length it covers.
Engines render requests into tokens their own way, so a key says that two openings are the
same, not how many tokens match; the bytes it covers, times the tokens per byte learned from
usage, estimate that.

`prefer` is the placement rule both the scheduler and a dataplane placing a new run itself
apply, the way sglang-router's cache_aware weighs its tree against load: among the replicas a
new run may go to, those whose load is within LOAD_SLACK of the least loaded one compete on the
longest opening they served; without a match, the least loaded wins.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

OPENING_MESSAGES = 4
"""Messages of a conversation's start that make up its opening keys (after its tools)."""

MAX_KEY_BYTES = 1 << 20
"""An opening past this many bytes ends the keys: a longer one is a run's own history."""

LOAD_SLACK = 2
LOAD_SLACK_SHARE = 0.25
"""A replica competes on its cached opening while its load is at most the least loaded one's
plus the larger of LOAD_SLACK turns and LOAD_SLACK_SHARE of that load."""

Key = tuple[int, int]
"""(hash, bytes of the opening it covers)."""

_R = TypeVar("_R")


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


def prefer(
    candidates: Sequence[_R], load: Callable[[_R], float], matched: Callable[[_R], int]
) -> _R | None:
    """The candidate a new run goes to: the longest match among those near the least load.

    `candidates` come in the order the run would take them without a match (least loaded
    first); among equal matches the earlier one wins.
    """
    if not candidates:
        return None
    least = min(load(c) for c in candidates)
    slack = max(LOAD_SLACK, LOAD_SLACK_SHARE * least)
    near = [c for c in candidates if load(c) <= least + slack]
    # max() keeps the first of equals: candidates come least loaded first from the caller.
    best = max(near, key=matched)
    return best if matched(best) > 0 else candidates[0]
