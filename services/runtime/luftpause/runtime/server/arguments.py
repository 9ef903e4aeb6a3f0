"""The arguments `spawn` and `run` share, as one record, and the flat tool signature MCP sees.

Pure module: no I/O. `SpawnArgs` (and `RunArgs`, which adds run's `timeout`) are frozen
pydantic dataclasses, so they check their input however they are built: from a tool call, or
from the raw arguments the Tasks extension intercepts (`spawn_args`). `flat_tool` turns a tool
body `body(args, ctx)` into a function whose keyword parameters are the record's fields, so the
SDK derives the input schema a hand-written signature would give: the same names, types,
defaults and descriptions, written once.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context
from pydantic import Field, ValidationError
from pydantic.dataclasses import dataclass

from luftpause.runtime.core.errors import RequestError

AWAIT_DEFAULT = 60.0
AWAIT_MAX = 600.0

Timeout = Annotated[float, Field(ge=0, le=AWAIT_MAX, description="seconds to wait (max 600)")]
Count = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0)]
Usd = Annotated[float, Field(ge=0, allow_inf_nan=False)]


@dataclass(frozen=True, slots=True, kw_only=True)
class SpawnArgs:
    """What a caller may say about a run it starts; the names are the tool's parameters."""

    task: str
    model: str | None = None
    serviceClass: Literal["interactive", "batch"] | None = None
    system: str | None = None
    maxToolCalls: Count | None = None
    tools: list[str] | None = None
    maxTokens: Count | None = None
    parallelToolCalls: bool | None = None
    parent: str | None = None
    budgetTokens: Count | None = None
    budgetToolCalls: Count | None = None
    budgetSeconds: Seconds | None = None
    budgetUsd: Usd | None = None
    approveTools: list[str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunArgs(SpawnArgs):
    """`run`'s arguments: a spawn's, and how long to wait for the run."""

    timeout: Timeout = AWAIT_DEFAULT


_KEYWORD = inspect.Parameter.KEYWORD_ONLY

A = TypeVar("A", bound=SpawnArgs)
R = TypeVar("R")


def spawn_args(raw: Mapping[str, Any]) -> SpawnArgs:
    """A spawn's arguments from a raw tool call's; `RequestError` saying which do not fit.

    Names that are not spawn's (run's `timeout`) are ignored, as a tool call ignores them.
    """
    try:
        return SpawnArgs(**raw)
    except ValidationError as exc:
        raise RequestError(f"bad arguments: {problems(exc)}") from exc


def problems(exc: ValidationError) -> str:
    """A validation error in one line: each argument and what is wrong with it."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
    )


def flat_tool(
    args_type: type[A], body: Callable[[A, Context[Any, Any]], Awaitable[R]]
) -> Callable[..., Awaitable[R]]:
    """`body` as a tool function taking `args_type`'s fields as keyword parameters (and the
    request's context), with `body`'s name, docstring and return type.

    The SDK reads a tool's parameters from its signature and its type hints, so both are set.
    """
    hints = typing.get_type_hints(args_type, include_extras=True)
    params = [inspect.Parameter("ctx", _KEYWORD, annotation=Context[Any, Any])]
    for f in dataclasses.fields(args_type):
        default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        params.append(
            inspect.Parameter(f.name, _KEYWORD, annotation=hints[f.name], default=default)
        )
    returns = inspect.signature(body, eval_str=True).return_annotation

    async def tool(ctx: Context[Any, Any], **fields: Any) -> R:
        return await body(args_type(**fields), ctx)

    tool.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    tool.__annotations__ = {p.name: p.annotation for p in params} | {"return": returns}
    tool.__name__ = tool.__qualname__ = body.__name__
    tool.__doc__ = body.__doc__
    tool.__module__ = body.__module__
    return tool
