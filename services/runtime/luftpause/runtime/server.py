"""The MCP face of the runtime: tools spawn, await, run, status, cancel, tools; GET /status.

Shell module: the `mcp` SDK's `MCPServer` over Streamable HTTP at /mcp, plus a JSON status
route. Every tool answers with structured JSON; the work is `runs.Runtime`'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from luftpause.runtime import machine as m
from luftpause.runtime import tree
from luftpause.runtime.errors import RequestError
from luftpause.runtime.runs import Runtime, new_handle

AWAIT_DEFAULT = 60.0
AWAIT_MAX = 600.0
_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)

Timeout = Annotated[float, Field(ge=0, le=AWAIT_MAX, description="seconds to wait (max 600)")]


def caller_of(ctx: Context[Any, Any] | None) -> str:
    """The MCP session id when there is one, else the client's name: the turns' caller."""
    if ctx is None:
        return "mcp"
    try:
        headers = ctx.headers or {}
        session = headers.get("mcp-session-id")
        if session:
            return str(session)
        params = ctx.session.client_params
        if params is not None:
            return f"mcp:{params.client_info.name}"
    except (AttributeError, LookupError, ValueError):
        pass
    return "mcp"


def build_server(runtime: Runtime, *, default_model: str) -> MCPServer:
    """The MCP server with the runtime's tools and the /status route."""
    server: MCPServer = MCPServer(
        "luftpause-runtime",
        instructions=(
            "Durable sub-agents: spawn runs a task with its own model loop and tools and returns "
            "a handle at once; await collects results; run does both in one call."
        ),
    )

    async def do_spawn(args: dict[str, Any], ctx: Context[Any, Any] | None) -> str:
        try:
            spec = m.RunSpec(
                handle=new_handle(),
                task=args["task"],
                model=args.get("model") or default_model,
                service_class=args.get("serviceClass") or "interactive",
                system=args.get("system"),
                max_tool_calls=_or(args.get("maxToolCalls"), m.DEFAULT_MAX_TOOL_CALLS),
                tools=None if args.get("tools") is None else tuple(args["tools"]),
                max_tokens=_or(args.get("maxTokens"), m.DEFAULT_MAX_TOKENS),
                parallel_tool_calls=bool(args.get("parallelToolCalls")),
                parent=args.get("parent"),
                caller=caller_of(ctx),
            )
        except ValueError as exc:
            raise RequestError(str(exc)) from exc
        return await runtime.spawn(spec)

    @server.tool(name="spawn", structured_output=True)
    async def spawn(
        task: str,
        ctx: Context[Any, Any],
        model: str | None = None,
        serviceClass: Literal["interactive", "batch"] | None = None,
        system: str | None = None,
        maxToolCalls: Annotated[int, Field(ge=0)] | None = None,
        tools: list[str] | None = None,
        maxTokens: Annotated[int, Field(ge=0)] | None = None,
        parallelToolCalls: bool | None = None,
        parent: str | None = None,
    ) -> dict[str, Any]:
        """Start a sub-agent on `task`; returns its handle at once (collect it with await)."""
        handle = await do_spawn(dict(locals()), ctx)
        return {"handle": handle}

    @server.tool(name="await", structured_output=True)
    async def await_(
        handles: list[str],
        mode: Literal["all", "any"] = "all",
        timeout: Timeout = AWAIT_DEFAULT,
    ) -> dict[str, Any]:
        """Wait for all (or any) of the runs to end, at most `timeout` s; then each run's state."""
        return {"runs": await runtime.await_runs(handles, mode, timeout)}

    @server.tool(name="run", structured_output=True)
    async def run(
        task: str,
        ctx: Context[Any, Any],
        model: str | None = None,
        serviceClass: Literal["interactive", "batch"] | None = None,
        system: str | None = None,
        maxToolCalls: Annotated[int, Field(ge=0)] | None = None,
        tools: list[str] | None = None,
        maxTokens: Annotated[int, Field(ge=0)] | None = None,
        parallelToolCalls: bool | None = None,
        parent: str | None = None,
        timeout: Timeout = AWAIT_DEFAULT,
    ) -> dict[str, Any]:
        """Spawn a sub-agent and wait for it (at most `timeout` s): its state and result."""
        handle = await do_spawn(dict(locals()), ctx)
        [result] = await runtime.await_runs([handle], "all", timeout)
        return result

    @server.tool(name="status", annotations=_READ_ONLY, structured_output=True)
    async def status(handles: list[str] | None = None) -> dict[str, Any]:
        """The state of the given runs (all runs when none are given), without waiting."""
        chosen = list(runtime.runs) if handles is None else handles
        return {"runs": [runtime.summary(h) for h in chosen]}

    @server.tool(name="cancel", structured_output=True)
    async def cancel(handle: str) -> dict[str, Any]:
        """Cancel a run and its running descendants."""
        return {"cancelled": await runtime.cancel(handle)}

    @server.tool(name="tools", annotations=_READ_ONLY, structured_output=True)
    async def tools_() -> dict[str, Any]:
        """The upstream tools a sub-agent may use (name them in spawn's `tools` to restrict)."""
        return {"tools": await runtime.tools()}

    @server.custom_route("/status", methods=["GET"])
    async def status_route(request: Request) -> Response:
        return JSONResponse(tree.status(runtime.runs))

    return server


def _or(value: Any, default: int) -> int:
    return default if value is None else int(value)
