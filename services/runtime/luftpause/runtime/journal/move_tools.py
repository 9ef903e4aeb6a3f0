"""The MCP tools fork, export and import, and their HTTP routes for scripts.

Shell module: `Migrations` does the work; this is its face. Tools (after the runtime's own in
tools/list): `fork(handle, n, instructions?, model?, serviceClass?, budget*?)`,
`export(handle, subtree?)` (the bundle as JSON text), `import(bundle)`. Routes, behind the
same bearer auth as /mcp and /status (`auth`):

    GET  /runs/{handle}/export[?subtree=true]   200 the bundle (application/json)
    POST /runs/import                           body: a bundle; 200 {"imported": [...]}

Refusals are an MCP tool error with the reason, or on HTTP `{"error": {"message", "code"}}`:
404 no such run, 403 a run of another key, 409 runs that exist already, 413 too large, 400 any
other bad bundle (malformed, another format, a newer version, a checksum that does not match).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from luftpause.common.auth import Identity
from luftpause.runtime.core.bundle import MAX_BYTES, encode
from luftpause.runtime.core.errors import (
    BundleError,
    Forbidden,
    JournalUnwritable,
    NoRun,
    RequestError,
)
from luftpause.runtime.core.forks import MAX_FORKS
from luftpause.runtime.journal.moves import Migrations
from luftpause.runtime.server.arguments import Count, Seconds
from luftpause.runtime.server.auth import identity_of

Forks = Annotated[int, Field(ge=1, le=MAX_FORKS, description=f"how many forks (1 to {MAX_FORKS})")]
Instructions = Annotated[
    str | list[str] | None,
    Field(description="each fork's own instruction (one string for all, or one per fork)"),
]
_STATUS = {"bundle_conflict": 409}
_TRUE = frozenset({"1", "true", "yes"})


def add_migrations(
    server: MCPServer,
    migrations: Migrations,
    caller_of: Callable[[Context[Any, Any] | None], str],
    identity_in: Callable[[Context[Any, Any] | None], Identity],
) -> None:
    """Register fork, export and import as tools and the two routes."""
    tools = MigrationTools(migrations, caller_of, identity_in)
    server.add_tool(tools.fork, name="fork", structured_output=True)
    server.add_tool(tools.export, name="export", structured_output=True)
    server.add_tool(tools.import_, name="import", structured_output=True)
    server.custom_route("/runs/{handle}/export", methods=["GET"])(tools.export_route)
    server.custom_route("/runs/import", methods=["POST"])(tools.import_route)


class MigrationTools:
    """Each method is one tool or route, named as `add_migrations` registers it."""

    def __init__(
        self,
        migrations: Migrations,
        caller_of: Callable[[Context[Any, Any] | None], str],
        identity_in: Callable[[Context[Any, Any] | None], Identity],
    ) -> None:
        self.migrations = migrations
        self.caller_of = caller_of
        self.identity_in = identity_in

    async def fork(
        self,
        handle: str,
        ctx: Context[Any, Any],
        n: Forks = 1,
        instructions: Instructions = None,
        model: str | None = None,
        serviceClass: Literal["interactive", "batch"] | None = None,
        budgetTokens: Count | None = None,
        budgetToolCalls: Count | None = None,
        budgetSeconds: Seconds | None = None,
    ) -> dict[str, Any]:
        """Fork a run into n independent runs that go on from its last complete round (its
        history, usage and tool calls so far; the run itself goes on untouched), each with its
        own handle and, if given, its own instruction as a user message before its next turn.
        Model, class and budgets are the run's unless given here.
        """
        with _told_to_client():
            handles, rounds = await self.migrations.fork(
                handle,
                n,
                instructions,
                self.identity_in(ctx),
                self.caller_of(ctx),
                model=model,
                service_class=serviceClass,
                budget_tokens=budgetTokens,
                budget_tool_calls=budgetToolCalls,
                budget_seconds=budgetSeconds,
            )
        return {"from": handle, "round": rounds, "handles": handles}

    async def export(
        self, handle: str, ctx: Context[Any, Any], subtree: bool = False
    ) -> dict[str, Any]:
        """Export a run (with subtree, also every run below it) as a checksummed bundle (JSON
        text) that import resumes on another runtime at the same round. A run still going is
        exported at its last complete round, and goes on here.
        """
        with _told_to_client():
            bundle = await self.migrations.export(handle, self.identity_in(ctx), subtree=subtree)
        return {"bundle": encode(bundle), "runs": list(bundle.runs)}

    async def import_(self, bundle: str, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Import the runs of a bundle that export gave (its JSON text, or that in base64):
        they are journaled here and resume at the round they were exported at.
        """
        with _told_to_client():
            handles = await self.migrations.import_(bundle, self.identity_in(ctx))
        runtime = self.migrations.runtime
        return {"imported": handles, "runs": [runtime.summary(h) for h in handles]}

    async def export_route(self, request: Request) -> Response:
        """GET /runs/{handle}/export: the bundle, as export gives it."""
        subtree = request.query_params.get("subtree", "").lower() in _TRUE
        try:
            bundle = await self.migrations.export(
                request.path_params["handle"], identity_of(request), subtree=subtree
            )
        except RequestError as exc:
            return _refusal(exc)
        return Response(encode(bundle), media_type="application/json")

    async def import_route(self, request: Request) -> Response:
        """POST /runs/import: the bundle in the body; the runs imported."""
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > MAX_BYTES:
            message = f"bundle larger than {MAX_BYTES} bytes"
            return JSONResponse({"error": {"message": message, "code": "too_large"}}, 413)
        try:
            handles = await self.migrations.import_(await request.body(), identity_of(request))
        except RequestError as exc:
            return _refusal(exc)
        return JSONResponse({"imported": handles})


def _refusal(exc: RequestError) -> Response:
    status = 400
    if isinstance(exc, NoRun):
        status = 404
    elif isinstance(exc, Forbidden):
        status = 403
    elif isinstance(exc, BundleError):
        status = _STATUS.get(exc.code, 400)
    elif isinstance(exc, JournalUnwritable):
        status = 503
    body = {"error": {"message": str(exc), "code": exc.code}}
    return JSONResponse(body, status_code=status)


@contextmanager
def _told_to_client() -> Iterator[None]:
    """A refusal's message goes to the client (the SDK hides other errors' text)."""
    try:
        yield
    except RequestError as exc:
        raise ToolError(str(exc)) from exc
