"""Tool-call hygiene: coercion, validation and the shape told back to the model."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from luftpause.runtime.core import hygiene
from luftpause.runtime.core.hygiene import check_arguments, recover_text_calls

SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "depth": {"type": "integer", "maximum": 5}},
    "required": ["query"],
}


def test_scalars_written_as_the_wrong_type_are_coerced_to_the_schema() -> None:
    assert check_arguments('{"query": 42, "depth": "3"}', SCHEMA) == (
        {"query": "42", "depth": 3},
        "",
    )


def test_arguments_that_do_not_fit_are_rejected_with_the_expected_shape() -> None:
    args, why = check_arguments('{"depth": 9}', SCHEMA)
    assert args is None
    assert "query" in why and '"depth": "integer (optional)"' in why


def test_text_that_is_not_a_json_object_is_rejected() -> None:
    assert check_arguments("query=x", SCHEMA)[0] is None
    assert check_arguments("[1]", SCHEMA)[0] is None
    assert check_arguments("", {"type": "object"}) == ({}, "")


def _validate_says(args: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """What `jsonschema.validate` (which checks the schema on every call) says of `args`."""
    try:
        jsonschema.validate(args, schema)
    except jsonschema.ValidationError as exc:
        return str(exc.message)
    return None


@pytest.mark.parametrize(
    "args",
    [{"query": "a"}, {"depth": 9}, {"query": ["a"], "depth": 9}, {"query": "a", "depth": 6}, {}],
)
def test_the_compiled_validator_says_what_jsonschema_validate_says(
    args: dict[str, Any],
) -> None:
    raw = json.dumps(args)
    for _ in range(2):  # compiled on the first call, reused on the second
        fits, why = check_arguments(raw, SCHEMA)
        expected = _validate_says(args, SCHEMA)
        assert (fits is None) == (expected is not None)
        if expected is not None:
            assert why.startswith(f"invalid arguments ({expected}); expected ")


def test_a_broken_schema_lets_the_tool_judge_and_the_kept_validators_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = {"type": "object", "properties": {"q": {"type": 12}}}
    assert check_arguments('{"q": 1}', broken) == ({"q": 1}, "")
    monkeypatch.setattr(hygiene, "_validators", {})
    monkeypatch.setattr(hygiene, "VALIDATORS_KEPT", 3)
    for i in range(5):
        schema = {"type": "object", "properties": {"q": {"type": "integer", "maximum": i}}}
        fits, _ = check_arguments('{"q": 3}', schema)
        assert (fits is not None) == (i >= 3)
    assert len(hygiene._validators) == 3
    # an equal schema written in another key order is the same validator
    a = {"type": "object", "required": ["q"], "properties": {"q": {"type": "string"}}}
    b = {"properties": {"q": {"type": "string"}}, "required": ["q"], "type": "object"}
    check_arguments('{"q": "x"}', a)
    kept = len(hygiene._validators)
    check_arguments('{"q": "x"}', b)
    assert len(hygiene._validators) == kept


NAMES = frozenset({"lookup", "deep_search"})


def test_calls_written_in_tool_call_tags_are_recovered() -> None:
    text = 'Let me check. <tool_call>lookup {"query": "Rhine"}</tool_call>'
    assert recover_text_calls(text, NAMES) == [("lookup", '{"query": "Rhine"}')]
    tagged_json = '<tool_call>{"name": "deep_search", "arguments": {"query": "Elbe"}}</tool_call>'
    assert recover_text_calls(tagged_json, NAMES) == [("deep_search", '{"query": "Elbe"}')]


def test_a_reply_that_is_a_bare_json_call_is_recovered_but_prose_is_not() -> None:
    bare = '{"name": "lookup", "parameters": {"query": "Oder"}}'
    assert recover_text_calls(bare, NAMES) == [("lookup", '{"query": "Oder"}')]
    assert recover_text_calls("The Rhine is long.", NAMES) == []
    assert recover_text_calls('{"name": "rm_rf", "arguments": {}}', NAMES) == []
    assert recover_text_calls('<tool_call>{"query": 1}</tool_call>', NAMES) == []
