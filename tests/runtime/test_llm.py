"""The turn client's Retry-After parsing (no network)."""

from __future__ import annotations

from luftpause.runtime.loop.llm import DEFAULT_RETRY_AFTER, retry_after


def test_retry_after_in_seconds_is_used_and_anything_else_falls_back_to_one_second() -> None:
    assert retry_after({"retry-after": "2.5"}) == 2.5
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == DEFAULT_RETRY_AFTER
    assert retry_after({}) == DEFAULT_RETRY_AFTER == 1.0
    assert retry_after(None) == DEFAULT_RETRY_AFTER
