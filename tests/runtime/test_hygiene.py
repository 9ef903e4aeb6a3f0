"""Tool-call hygiene: coercion, validation and the shape told back to the model."""

from __future__ import annotations

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
