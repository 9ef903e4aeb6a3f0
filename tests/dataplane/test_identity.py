"""Run identity: echoed tool call ids, their expiry, class and caller headers."""

from __future__ import annotations

import pytest

from luftpause.dataplane.errors import BadRequest
from luftpause.dataplane.identity import (
    CALLER_MAX_BYTES,
    ServiceClass,
    ToolCallMemory,
    cut_caller,
    echoed_tool_call_ids,
    parse_service_class,
)

MINUTE = 60.0


def test_echoed_tool_call_id_is_recognised_as_its_run() -> None:
    memory = ToolCallMemory()
    memory.remember(["call_a", "call_b"], "run-1", now=0.0)
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [{"id": "call_a"}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "42"},
    ]
    assert memory.recognise(echoed_tool_call_ids(messages), now=10 * MINUTE) == "run-1"


def test_latest_tool_message_wins_when_ids_of_two_runs_are_echoed() -> None:
    memory = ToolCallMemory()
    memory.remember(["old"], "run-old", now=0.0)
    memory.remember(["new"], "run-new", now=1.0)
    messages = [
        {"role": "tool", "tool_call_id": "old", "content": ""},
        {"role": "tool", "tool_call_id": "new", "content": ""},
    ]
    assert memory.recognise(echoed_tool_call_ids(messages), now=2.0) == "run-new"


def test_unknown_ids_and_non_tool_messages_recognise_nothing() -> None:
    memory = ToolCallMemory()
    memory.remember(["call_a"], "run-1", now=0.0)
    messages = [{"role": "user", "tool_call_id": "call_a"}, {"role": "tool", "tool_call_id": 7}]
    assert memory.recognise(echoed_tool_call_ids(messages), now=1.0) is None
    assert memory.recognise(["call_z"], now=1.0) is None


def test_tool_call_id_is_forgotten_after_thirty_minutes() -> None:
    memory = ToolCallMemory()
    memory.remember(["call_a"], "run-1", now=0.0)
    assert memory.recognise(["call_a"], now=30 * MINUTE - 1) == "run-1"
    assert memory.recognise(["call_a"], now=30 * MINUTE) is None


def test_prune_drops_only_expired_ids() -> None:
    memory = ToolCallMemory()
    memory.remember(["old"], "run-1", now=0.0)
    memory.remember(["new"], "run-2", now=20 * MINUTE)
    assert memory.prune(now=31 * MINUTE) == 1
    assert len(memory) == 1
    assert memory.recognise(["new"], now=31 * MINUTE) == "run-2"


def test_seeing_an_id_again_extends_its_memory() -> None:
    memory = ToolCallMemory()
    memory.remember(["call_a"], "run-1", now=0.0)
    memory.remember(["call_a"], "run-1", now=20 * MINUTE)
    assert memory.recognise(["call_a"], now=40 * MINUTE) == "run-1"


def test_forget_run_drops_its_ids() -> None:
    memory = ToolCallMemory()
    memory.remember(["a", "b"], "run-1", now=0.0)
    memory.remember(["c"], "run-2", now=0.0)
    memory.forget_run("run-1")
    assert memory.recognise(["a", "b"], now=1.0) is None
    assert memory.recognise(["c"], now=1.0) == "run-2"


def test_caller_is_cut_at_128_bytes() -> None:
    assert cut_caller("x" * 200) == "x" * CALLER_MAX_BYTES
    assert cut_caller("short") == "short"
    assert cut_caller(None) == "" and cut_caller("") == ""


def test_caller_cut_never_splits_a_utf8_character() -> None:
    caller = "a" + "€" * 60  # 1 + 3 * 60 bytes; byte 128 falls inside a euro sign
    cut = cut_caller(caller)
    assert len(cut.encode()) <= CALLER_MAX_BYTES
    assert cut == "a" + "€" * 42
    assert len(cut.encode()) == 127


def test_caller_bytes_that_are_not_utf8_are_dropped() -> None:
    assert cut_caller("ab\udcffc") == "abc"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ServiceClass.INTERACTIVE),
        ("interactive", ServiceClass.INTERACTIVE),
        ("batch", ServiceClass.BATCH),
        (" Batch ", ServiceClass.BATCH),
    ],
)
def test_service_class_header_is_read(raw: str | None, expected: ServiceClass) -> None:
    assert parse_service_class(raw) is expected


@pytest.mark.parametrize("raw", ["", "urgent", "background"])
def test_other_service_classes_are_bad_requests(raw: str) -> None:
    with pytest.raises(BadRequest):
        parse_service_class(raw)
