"""Opening keys, and how much of an opening a replica served lately (pure)."""

from __future__ import annotations

from typing import Any

from luftpause.common.prefixes import MAX_KEY_BYTES, matched_bytes, opening_keys

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
SYSTEM = {"role": "system", "content": "You are a research agent."}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_a_longer_conversation_keeps_the_keys_of_its_start() -> None:
    short = opening_keys([SYSTEM, user("task A")], TOOLS)
    longer = opening_keys([SYSTEM, user("task A"), {"role": "assistant", "content": "x"}], TOOLS)
    assert longer[: len(short)] == short and len(longer) == len(short) + 1
    sizes = [size for _, size in longer]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)


def test_runs_that_open_alike_share_keys_until_they_differ() -> None:
    a = opening_keys([SYSTEM, user("task A")], TOOLS)
    b = opening_keys([SYSTEM, user("task B")], TOOLS)
    assert a[:2] == b[:2] and a[2] != b[2]  # tools, system prompt; then their own tasks
    assert opening_keys([SYSTEM], None)[0] != a[1]  # without the tools it is another prompt


def test_keys_do_not_depend_on_the_order_of_json_fields() -> None:
    one = {"role": "user", "content": "hi", "name": "n"}
    two = {"name": "n", "content": "hi", "role": "user"}
    assert opening_keys([one]) == opening_keys([two])


def test_only_the_first_messages_and_a_bounded_size_make_keys() -> None:
    many = [user(f"m{i}") for i in range(10)]
    assert len(opening_keys(many)) == 4
    huge = [user("x" * (MAX_KEY_BYTES + 10)), user("y")]
    assert opening_keys(huge) == ()


def test_the_longest_known_key_is_the_match() -> None:
    keys = opening_keys([SYSTEM, user("task A")], TOOLS)
    assert matched_bytes(keys, {keys[0][0]: 1, keys[1][0]: 1}) == keys[1][1]
    assert matched_bytes(keys, {}) == 0
