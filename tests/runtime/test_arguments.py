"""`arguments`: spawn's and run's shared parameters as one checked record, and the flat tool
function built from it. Pure: no event loop but the one a tool body needs."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import pytest
from mcp.server.mcpserver import Context

from luftpause.runtime.core.errors import RequestError
from luftpause.runtime.server.arguments import (
    AWAIT_DEFAULT,
    RunArgs,
    SpawnArgs,
    flat_tool,
    spawn_args,
)


def test_raw_arguments_become_a_record_and_names_that_are_not_spawns_are_ignored() -> None:
    args = spawn_args({"task": "t", "maxToolCalls": 2, "tools": ["lookup"], "timeout": 900})
    assert args == SpawnArgs(task="t", maxToolCalls=2, tools=["lookup"])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "bad arguments: task: Field required"),
        ({"task": "t", "maxToolCalls": -1}, "bad arguments: maxToolCalls: Input should be"),
        ({"task": "t", "serviceClass": "urgent"}, "bad arguments: serviceClass: Input should be"),
        ({"task": ["t"], "budgetSeconds": -1}, "bad arguments: task: Input should be a valid"),
    ],
)
def test_raw_arguments_that_do_not_fit_are_refused_naming_each_argument(
    raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(RequestError, match=message) as refused:
        spawn_args(raw)
    assert "\n" not in str(refused.value)  # one line, no pydantic banner
    if "budgetSeconds" in raw:
        assert "; budgetSeconds: " in str(refused.value)


def test_the_records_check_their_input_however_they_are_built() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        SpawnArgs(task="t", budgetTokens=-1)
    with pytest.raises(ValueError, match="less than or equal to 600"):
        RunArgs(task="t", timeout=601)
    assert RunArgs(task="t").timeout == AWAIT_DEFAULT


def test_a_record_is_frozen() -> None:
    args = SpawnArgs(task="t")
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.task = "other"  # type: ignore[misc]


def test_run_has_every_spawn_parameter_in_the_same_order_then_its_timeout() -> None:
    spawn = [f.name for f in dataclasses.fields(SpawnArgs)]
    assert [f.name for f in dataclasses.fields(RunArgs)] == [*spawn, "timeout"]


async def test_a_flat_tool_takes_the_fields_as_keywords_and_hands_the_body_the_record() -> None:
    seen: list[tuple[RunArgs, Any]] = []

    async def body(args: RunArgs, ctx: Context[Any, Any]) -> dict[str, Any]:
        """What the tool does."""
        seen.append((args, ctx))
        return {"task": args.task}

    tool = flat_tool(RunArgs, body)
    signature = inspect.signature(tool)
    assert list(signature.parameters) == ["ctx", *(f.name for f in dataclasses.fields(RunArgs))]
    assert signature.parameters["task"].default is inspect.Parameter.empty
    assert signature.parameters["timeout"].default == AWAIT_DEFAULT
    assert signature.return_annotation == dict[str, Any]
    assert typing.get_type_hints(tool)["ctx"] == Context[Any, Any]
    assert (tool.__name__, tool.__doc__) == ("body", "What the tool does.")

    assert await tool(ctx="the context", task="t", timeout=5.0) == {"task": "t"}
    assert seen == [(RunArgs(task="t", timeout=5.0), "the context")]
    with pytest.raises(ValueError, match="timeout"):
        await tool(ctx=None, task="t", timeout=-1)
