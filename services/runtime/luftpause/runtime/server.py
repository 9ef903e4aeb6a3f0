"""The MCP face of the runtime: tools spawn, await, run, status, cancel, approve, decide,
tools; GET /status, GET /health (liveness), GET /ready (readiness: its dataplane is ready) and
GET /metrics (Prometheus, see `metrics`).

Shell module: the `mcp` SDK's `MCPServer` over Streamable HTTP at /mcp, plus JSON status,
health and readiness routes. Every tool answers with structured JSON; the work is
`runs.Runtime`'s, the questions to the user during await and run are `ask`'s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from mcp.server.extension import Extension
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import InputRequiredResult, ToolAnnotations
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from luftpause.common import tracing
from luftpause.runtime import machine as m
from luftpause.runtime import spans, tree
from luftpause.runtime.ask import covering_wait
from luftpause.runtime.errors import RequestError, TurnError
from luftpause.runtime.readiness import Verdict
from luftpause.runtime.runs import Runtime, new_handle

AWAIT_DEFAULT = 60.0
AWAIT_MAX = 600.0
_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)

Timeout = Annotated[float, Field(ge=0, le=AWAIT_MAX, description="seconds to wait (max 600)")]
Count = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0)]


@contextmanager
def _told_to_client() -> Iterator[None]:
    """A malformed request's message goes to the client (the SDK hides other errors' text)."""
    try:
        yield
    except RequestError as exc:
        raise ToolError(str(exc)) from exc


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


def spec_from(args: dict[str, Any], caller: str, default_model: str) -> m.RunSpec:
    """A run's spec from spawn's (or run's) arguments; `ToolError` when they do not fit."""
    try:
        return m.RunSpec(
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
            caller=caller,
            budget_tokens=args.get("budgetTokens"),
            budget_tool_calls=args.get("budgetToolCalls"),
            budget_seconds=args.get("budgetSeconds"),
            approve_tools=tuple(args.get("approveTools") or ()),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ToolError(f"bad arguments: {exc}") from exc


def build_server(
    runtime: Runtime,
    *,
    default_model: str,
    decide_model: str | None = None,
    extensions: list[Extension] | None = None,
    readiness: Callable[[], Awaitable[Verdict]] | None = None,
) -> MCPServer:
    """The MCP server with the runtime's tools and its routes; without `readiness`, /ready
    answers as /health does."""
    server: MCPServer = MCPServer(
        "luftpause-runtime",
        extensions=extensions,
        instructions=(
            "Durable sub-agents: spawn runs a task with its own model loop and tools and returns "
            "a handle at once; await collects results; run does both in one call."
        ),
    )

    async def do_spawn(args: dict[str, Any], ctx: Context[Any, Any] | None) -> str:
        spec = spec_from(args, caller_of(ctx), default_model)
        with _told_to_client():
            if tracing.enabled():  # the run's span hangs under the caller's trace
                return await runtime.spawn(spec, caller_trace=spans.caller_traceparent(ctx))
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
        budgetTokens: Count | None = None,
        budgetToolCalls: Count | None = None,
        budgetSeconds: Seconds | None = None,
        approveTools: list[str] | None = None,
    ) -> dict[str, Any]:
        """Start a sub-agent on `task`; returns its handle at once (collect it with await).

        Budgets cap the run and every run spawned under it (tokens, tool calls, seconds);
        approveTools names tools whose calls wait for the user's approval.
        """
        handle = await do_spawn(dict(locals()), ctx)
        return {"handle": handle}

    @server.tool(name="await", structured_output=True)
    async def await_(
        handles: list[str],
        ctx: Context[Any, Any],
        mode: Literal["all", "any"] = "all",
        timeout: Timeout = AWAIT_DEFAULT,
    ) -> dict[str, Any] | InputRequiredResult:
        """Wait for all (or any) of the runs to end, at most `timeout` s; then each run's state."""
        out = await covering_wait(runtime, handles, mode, timeout, ctx)
        return out if isinstance(out, InputRequiredResult) else {"runs": out}

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
        budgetTokens: Count | None = None,
        budgetToolCalls: Count | None = None,
        budgetSeconds: Seconds | None = None,
        approveTools: list[str] | None = None,
        timeout: Timeout = AWAIT_DEFAULT,
    ) -> dict[str, Any] | InputRequiredResult:
        """Spawn a sub-agent and wait for it (at most `timeout` s): its state and result."""
        # A call repeated with the answers to its questions carries its run in requestState.
        handle = ctx.request_state if ctx.request_state in runtime.runs else None
        if handle is None:
            handle = await do_spawn(dict(locals()), ctx)
        out = await covering_wait(runtime, [handle], "all", timeout, ctx, request_state=handle)
        return out if isinstance(out, InputRequiredResult) else out[0]

    @server.tool(name="status", annotations=_READ_ONLY, structured_output=True)
    async def status(handles: list[str] | None = None) -> dict[str, Any]:
        """The state of the given runs (all runs when none are given), without waiting."""
        chosen = list(runtime.runs) if handles is None else handles
        return {"runs": [runtime.summary(h) for h in chosen]}

    @server.tool(name="cancel", structured_output=True)
    async def cancel(handle: str) -> dict[str, Any]:
        """Cancel a run and its running descendants."""
        with _told_to_client():
            return {"cancelled": await runtime.cancel(handle)}

    @server.tool(name="approve", structured_output=True)
    async def approve(handle: str, allow: bool) -> dict[str, Any]:
        """Allow or decline the tool call a run is waiting on (state AwaitingApproval)."""
        with _told_to_client():
            return await runtime.approve(handle, allow)

    @server.tool(name="decide", annotations=_READ_ONLY, structured_output=True)
    async def decide(
        input: str,
        ctx: Context[Any, Any],
        labels: Annotated[list[str], Field(min_length=2, max_length=20)] | None = None,
        model: str | None = None,
    ) -> dict[str, Any]:
        """Classify `input`: without labels by the single-pass model's own labels; with 2 to 20
        labels by one one-token turn of the generative model. Returns label and probabilities.
        """
        chosen = model or (default_model if labels else decide_model)
        if chosen is None:
            raise ToolError("decide without labels needs a model (or the runtime's --decide-model)")
        body: dict[str, Any] = {"model": chosen, "input": input}
        if labels:
            body["labels"] = labels
        try:
            return await runtime.llm.decide(body, caller_of(ctx))
        except TurnError as exc:
            raise ToolError(str(exc)) from exc

    @server.tool(name="tools", annotations=_READ_ONLY, structured_output=True)
    async def tools_() -> dict[str, Any]:
        """The upstream tools a sub-agent may use (name them in spawn's `tools` to restrict)."""
        return {"tools": await runtime.tools()}

    @server.custom_route("/status", methods=["GET"])
    async def status_route(request: Request) -> Response:
        return JSONResponse(tree.status(runtime.runs, runtime.clock()))

    @server.custom_route("/metrics", methods=["GET"])
    async def metrics_route(request: Request) -> Response:
        """Prometheus metrics; open like /health."""
        # The text format generate_latest writes, as the scheduler and dataplane label it.
        return Response(runtime.metrics.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    @server.custom_route("/health", methods=["GET"])
    async def health_route(request: Request) -> Response:
        """Liveness for probes and orchestrators; open even when auth is on."""
        return JSONResponse({"status": "ok"})

    @server.custom_route("/ready", methods=["GET"])
    async def ready_route(request: Request) -> Response:
        """Readiness: 200 while the dataplane answers its own /ready; open like /health."""
        verdict = None if readiness is None else await readiness()
        if verdict is None or verdict.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"error": {"message": verdict.message}}, status_code=503)

    return server


def _or(value: Any, default: int) -> int:
    return default if value is None else int(value)
