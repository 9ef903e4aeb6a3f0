"""The MCP face of the runtime: tools spawn, await, run, status, forecast, cancel, approve,
decide, tools; GET /status, GET /health (liveness), GET /ready (readiness: its dataplane is
ready) and GET /metrics (Prometheus, see `metrics`).

Shell module: the `mcp` SDK's `MCPServer` over Streamable HTTP at /mcp, plus JSON status, health
and readiness routes. Every tool answers with structured JSON; the work is
`loop.runtime.Runtime`'s, the questions to the user during await and run are `elicitation`'s.
Each tool is a method of `RuntimeTools` (its docstring is the tool's description); spawn and run
take their shared parameters as one record (`arguments.SpawnArgs`, `RunArgs`), flat on the wire.
A run belongs to the key its spawn request came with (`auth`, `owners`), when there is a keys
file. Fork, export and import (tools and their /runs routes) are `journal.move_tools`'; the
`away` tool and its /away route are `people.question_gate`'.
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
from luftpause.common.auth import ANYONE, Identity
from luftpause.common.keys import KeysFile
from luftpause.runtime.core import machine as m
from luftpause.runtime.core import status_tree
from luftpause.runtime.core.errors import RequestError, TurnError
from luftpause.runtime.core.owners import may_touch, owned
from luftpause.runtime.journal.move_tools import add_migrations
from luftpause.runtime.journal.moves import Migrations
from luftpause.runtime.loop import spans
from luftpause.runtime.loop.runtime import Runtime, new_handle
from luftpause.runtime.people.elicitation import covering_wait
from luftpause.runtime.people.question_gate import add_attention
from luftpause.runtime.server.arguments import (
    AWAIT_DEFAULT,
    RunArgs,
    SpawnArgs,
    Timeout,
    flat_tool,
)
from luftpause.runtime.server.auth import identity_of
from luftpause.runtime.server.readiness import Verdict

INSTRUCTIONS = (
    "Durable sub-agents: spawn runs a task with its own model loop and tools and returns "
    "a handle at once; await collects results; run does both in one call."
)
_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)

Readiness = Callable[[], Awaitable[Verdict]]


def build_server(
    runtime: Runtime,
    *,
    default_model: str,
    decide_model: str | None = None,
    extensions: list[Extension] | None = None,
    readiness: Readiness | None = None,
    keys: KeysFile | None = None,
) -> MCPServer:
    """The MCP server with the runtime's tools and its routes; without `readiness`, /ready
    answers as /health does."""
    server: MCPServer = MCPServer(
        "luftpause-runtime", extensions=extensions, instructions=INSTRUCTIONS
    )
    tools = RuntimeTools(runtime, default_model=default_model, decide_model=decide_model, keys=keys)
    add_tools(server, tools)
    add_routes(server, Routes(runtime, readiness))
    add_migrations(server, Migrations(runtime, keys), caller_of, identity_in)
    add_attention(server, runtime.questions, caller_of)
    return server


def add_tools(server: MCPServer, tools: RuntimeTools) -> None:
    """Every tool, in the order tools/list shows them."""
    server.add_tool(flat_tool(SpawnArgs, tools.spawn), name="spawn", structured_output=True)
    server.add_tool(tools.await_, name="await", structured_output=True)
    server.add_tool(flat_tool(RunArgs, tools.run), name="run", structured_output=True)
    server.add_tool(tools.status, name="status", annotations=_READ_ONLY, structured_output=True)
    server.add_tool(tools.forecast, name="forecast", annotations=_READ_ONLY, structured_output=True)
    server.add_tool(tools.cancel, name="cancel", structured_output=True)
    server.add_tool(tools.approve, name="approve", structured_output=True)
    server.add_tool(tools.decide, name="decide", annotations=_READ_ONLY, structured_output=True)
    server.add_tool(tools.tools_, name="tools", annotations=_READ_ONLY, structured_output=True)


def add_routes(server: MCPServer, routes: Routes) -> None:
    server.custom_route("/status", methods=["GET"])(routes.status_route)
    server.custom_route("/metrics", methods=["GET"])(routes.metrics_route)
    server.custom_route("/health", methods=["GET"])(routes.health_route)
    server.custom_route("/ready", methods=["GET"])(routes.ready_route)


class RuntimeTools:
    """The runtime's MCP tools: each method is one tool, named as `add_tools` registers it."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        default_model: str,
        decide_model: str | None,
        keys: KeysFile | None = None,
    ) -> None:
        self.runtime = runtime
        self.default_model = default_model
        self.decide_model = decide_model
        self.keys = keys

    async def spawn(self, args: SpawnArgs, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Start a sub-agent on `task`; returns its handle at once (collect it with await).

        Budgets cap the run and every run spawned under it (tokens, tool calls, seconds, USD);
        approveTools names tools whose calls wait for the user's approval.
        """
        return {"handle": await self._spawned(args, ctx)}

    async def await_(
        self,
        handles: list[str],
        ctx: Context[Any, Any],
        mode: Literal["all", "any"] = "all",
        timeout: Timeout = AWAIT_DEFAULT,
    ) -> dict[str, Any] | InputRequiredResult:
        """Wait for all (or any) of the runs to end, at most `timeout` s; then each run's state."""
        await self.runtime.known(handles)
        self._scoped(ctx, handles)
        out = await covering_wait(self.runtime, handles, mode, timeout, ctx, session=caller_of(ctx))
        return out if isinstance(out, InputRequiredResult) else {"runs": out}

    async def run(
        self, args: RunArgs, ctx: Context[Any, Any]
    ) -> dict[str, Any] | InputRequiredResult:
        """Spawn a sub-agent and wait for it (at most `timeout` s): its state and result."""
        # A call repeated with the answers to its questions carries its run in requestState.
        handle = ctx.request_state if ctx.request_state in self.runtime.runs else None
        if handle is not None:
            self._scoped(ctx, [handle])
        else:
            handle = await self._spawned(args, ctx)
        out = await covering_wait(
            self.runtime,
            [handle],
            "all",
            args.timeout,
            ctx,
            request_state=handle,
            session=caller_of(ctx),
        )
        return out if isinstance(out, InputRequiredResult) else out[0]

    async def status(
        self, ctx: Context[Any, Any], handles: list[str] | None = None
    ) -> dict[str, Any]:
        """The state of the given runs (all runs when none are given), without waiting; the
        approval questions waiting in them (oldest first) and this session's attention budget.
        """
        identity = identity_in(ctx)
        if handles is None and not may_touch(None, identity):
            chosen = [
                h for h, r in self.runtime.runs.items() if may_touch(r.state.spec.key, identity)
            ]
        elif handles is None:
            chosen = list(self.runtime.runs)
        else:
            await self.runtime.known(handles)
            chosen = self._scoped(ctx, handles)
        waiting = self.runtime.approvals.pending(chosen)
        runs = [self.runtime.summary(h) for h in chosen]
        # A live run's forecast, as the forecast tool gives it.
        await self.runtime.planner.add_forecasts(self.runtime.runs, runs, self.runtime.clock())
        return {
            "runs": runs,
            **self.runtime.questions.status(waiting, caller_of(ctx)),
        }

    async def forecast(
        self,
        handle: str,
        ctx: Context[Any, Any],
        steps: Annotated[int, Field(ge=1)] | None = None,
    ) -> dict[str, Any]:
        """Project the rest of a run (its tool calls left, or `steps` more rounds) from its own
        turns and its model's over all runs, without a model call: tokens, USD, seconds and
        rate-limit waits, and which limit (context window, or a budget) it meets first, at
        which step.
        """
        rt = self.runtime
        self._scoped(ctx, [handle])
        with _told_to_client():
            return await rt.planner.forecast(rt.runs, handle, steps, rt.clock())

    async def cancel(self, handle: str, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Cancel a run and its running descendants."""
        self._scoped(ctx, [handle])
        with _told_to_client():
            return {"cancelled": await self.runtime.cancel(handle)}

    async def approve(self, handle: str, allow: bool, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Allow or decline the tool call a run is waiting on (state AwaitingApproval)."""
        self._scoped(ctx, [handle])
        with _told_to_client():
            return await self.runtime.approve(handle, allow)

    async def decide(
        self,
        input: str,
        ctx: Context[Any, Any],
        labels: Annotated[list[str], Field(min_length=2, max_length=20)] | None = None,
        model: str | None = None,
    ) -> dict[str, Any]:
        """Classify `input`: without labels by the single-pass model's own labels; with 2 to 20
        labels by one one-token turn of the generative model. Returns label and probabilities.
        """
        chosen = model or (self.default_model if labels else self.decide_model)
        if chosen is None:
            raise ToolError("decide without labels needs a model (or the runtime's --decide-model)")
        body: dict[str, Any] = {"model": chosen, "input": input}
        if labels:
            body["labels"] = labels
        try:
            return await self.runtime.llm.decide(body, caller_of(ctx), key=identity_in(ctx).caller)
        except TurnError as exc:
            raise ToolError(str(exc)) from exc

    async def tools_(self) -> dict[str, Any]:
        """The upstream tools a sub-agent may use (name them in spawn's `tools` to restrict)."""
        return {"tools": await self.runtime.tools()}

    def _scoped(self, ctx: Context[Any, Any] | None, handles: list[str]) -> list[str]:
        """`handles`, once the request's key may touch each of their runs (`owners`); a run of
        another key is refused as if it did not exist to this key."""
        identity = identity_in(ctx)
        if may_touch(None, identity):
            return handles  # the operator, a service key, or no keys at all: every run
        for h in handles:
            run = self.runtime.runs.get(h)
            if run is not None and not may_touch(run.state.spec.key, identity):
                raise ToolError(f"run {h} belongs to another key")
        return handles

    async def _spawned(self, args: SpawnArgs, ctx: Context[Any, Any] | None) -> str:
        spec = spec_from(args, caller_of(ctx), self.default_model)
        # With tracing on, the run's span hangs under the caller's trace.
        trace = spans.caller_traceparent(ctx) if tracing.enabled() else None
        with _told_to_client():
            return await spawn_owned(self.runtime, spec, identity_in(ctx), self.keys, trace)


async def spawn_owned(
    runtime: Runtime,
    spec: m.RunSpec,
    identity: Identity,
    keys: KeysFile | None,
    caller_trace: str | None = None,
) -> str:
    """Spawn `spec` as the run of its key (`owners`); `RequestError` if the key may not."""
    parent = runtime.runs.get(spec.parent) if spec.parent is not None else None
    spec = owned(
        spec,
        identity,
        parent=None if parent is None else parent.state.spec,
        keys=None if keys is None else keys.current(),
    )
    if caller_trace is not None:
        return await runtime.spawn(spec, caller_trace=caller_trace)
    return await runtime.spawn(spec)


class Routes:
    """The plain HTTP routes beside /mcp."""

    def __init__(self, runtime: Runtime, readiness: Readiness | None) -> None:
        self.runtime = runtime
        self.readiness = readiness

    async def status_route(self, request: Request) -> Response:
        """The run tree with each run's own work and subtree totals (`status_tree`); the approval
        questions waiting (oldest first) and the away switches (`question_gate`); whether the
        journal can be written."""
        rt = self.runtime
        waiting = rt.questions.waiting(rt.approvals.pending(list(rt.runs)))
        status = status_tree.status(rt.runs, rt.clock())
        failing = rt.journal.failing
        journal = {"writable": failing is None} | ({"error": failing} if failing else {})
        extra = {"questions": waiting, "away": rt.questions.switches(), "journal": journal}
        return JSONResponse(status | extra)

    async def metrics_route(self, request: Request) -> Response:
        """Prometheus metrics; open like /health."""
        # The text format generate_latest writes, as the scheduler and dataplane label it.
        return Response(self.runtime.metrics.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    async def health_route(self, request: Request) -> Response:
        """Liveness for probes and orchestrators; open even when auth is on."""
        return JSONResponse({"status": "ok"})

    async def ready_route(self, request: Request) -> Response:
        """Readiness: 200 while the dataplane answers its own /ready; open like /health."""
        verdict = None if self.readiness is None else await self.readiness()
        if verdict is None or verdict.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"error": {"message": verdict.message}}, status_code=503)


@contextmanager
def _told_to_client() -> Iterator[None]:
    """A malformed request's message goes to the client (the SDK hides other errors' text)."""
    try:
        yield
    except RequestError as exc:
        raise ToolError(str(exc)) from exc


def identity_in(ctx: Context[Any, Any] | None) -> Identity:
    """Who the MCP request is (`auth` put it in the HTTP request's scope)."""
    if ctx is None:
        return ANYONE
    try:
        return identity_of(ctx.request_context.request)
    except (AttributeError, LookupError, ValueError):
        return ANYONE


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


def spec_from(args: SpawnArgs, caller: str, default_model: str) -> m.RunSpec:
    """A run's spec from spawn's (or run's) arguments; `ToolError` when they do not fit."""
    try:
        return m.RunSpec(
            handle=new_handle(),
            task=args.task,
            model=args.model or default_model,
            service_class=args.serviceClass or "interactive",
            system=args.system,
            max_tool_calls=_or(args.maxToolCalls, m.DEFAULT_MAX_TOOL_CALLS),
            tools=None if args.tools is None else tuple(args.tools),
            max_tokens=_or(args.maxTokens, m.DEFAULT_MAX_TOKENS),
            parallel_tool_calls=bool(args.parallelToolCalls),
            parent=args.parent,
            caller=caller,
            budget_tokens=args.budgetTokens,
            budget_tool_calls=args.budgetToolCalls,
            budget_seconds=args.budgetSeconds,
            budget_usd=args.budgetUsd,
            approve_tools=tuple(args.approveTools or ()),
        )
    except ValueError as exc:
        raise ToolError(f"bad arguments: {exc}") from exc


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
