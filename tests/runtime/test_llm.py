"""The turn client: its Retry-After parsing (no network), and the engine priority a turn's body
carries with --send-priority (a real server on loopback)."""

from __future__ import annotations

from typing import Any

import pytest

from luftpause.runtime.core.values import RunSpec
from luftpause.runtime.loop.llm import DEFAULT_RETRY_AFTER, Llm, retry_after
from luftpause.runtime.main import parse_args
from tests.runtime.loopback import plane


def test_retry_after_in_seconds_is_used_and_anything_else_falls_back_to_one_second() -> None:
    assert retry_after({"retry-after": "2.5"}) == 2.5
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == DEFAULT_RETRY_AFTER
    assert retry_after({}) == DEFAULT_RETRY_AFTER == 1.0
    assert retry_after(None) == DEFAULT_RETRY_AFTER


# --send-priority: what a turn's body carries, seen by a real HTTP server on loopback.


async def _bodies_of_turns(priorities: dict[str, int], classes: list[str]) -> list[dict[str, Any]]:
    """The JSON bodies a real `Llm` sends for one turn of a run of each class in `classes`."""
    async with plane() as fake:
        llm = Llm(fake.url, timeout=10.0, priorities=priorities)
        try:
            for i, cls in enumerate(classes):
                spec = RunSpec(handle=f"run-{i}", task="t", model="sim", service_class=cls)
                turn = await llm.turn(spec, ({"role": "user", "content": "hi"},), [])
                assert turn.content == "done"
        finally:
            await llm.close()
        return fake.bodies


async def test_a_turn_carries_the_priority_of_its_runs_class_only_when_told() -> None:
    told = await _bodies_of_turns({"interactive": 0, "batch": 100}, ["interactive", "batch"])
    assert [b.get("priority") for b in told] == [0, 100]
    only_batch = await _bodies_of_turns({"batch": 7}, ["interactive", "batch"])
    assert ["priority" in b for b in only_batch] == [False, True]
    assert only_batch[1]["priority"] == 7
    untold = await _bodies_of_turns({}, ["interactive", "batch"])
    assert all("priority" not in b for b in untold)


def test_send_priority_parses_class_and_number_and_refuses_anything_else(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = parse_args(["--send-priority", "interactive=0", "--send-priority", "batch=100"], {})
    assert config.send_priority == (("interactive", 0), ("batch", 100))
    assert parse_args([], {"LUFTPAUSE_SEND_PRIORITY": "batch=5,interactive=1"}).send_priority == (
        ("batch", 5),
        ("interactive", 1),
    )
    for bad in ("urgent=1", "batch", "batch=high"):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(["--send-priority", bad], {})
        assert exit_info.value.code == 2
        assert "--send-priority" in capsys.readouterr().err
