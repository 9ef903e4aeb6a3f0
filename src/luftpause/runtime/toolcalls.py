"""One tool call of a sub-agent, to the upstream MCP server that offers the tool.

Shell module: the call goes over the network (`upstream`). A call to a tool nobody offers, or
whose arguments do not fit the tool's schema after the hygiene's coercions (`hygiene`), gets an
error result the model can read and correct, never an exception; a call the user declined gets
`DECLINED`. With tracing on, each call runs inside its `execute_tool` span (`spans`).
"""

from __future__ import annotations

from luftpause.common import tracing
from luftpause.runtime import hygiene, spans
from luftpause.runtime import machine as m
from luftpause.runtime.upstream import Upstreams, UpstreamTool

DECLINED = "Error: the user declined this tool call"


async def call_one(
    upstreams: Upstreams, call: m.ToolCall, offered: dict[str, UpstreamTool]
) -> m.ToolResult:
    """The result of `call`, among the tools `offered` to its run."""
    if not tracing.enabled():
        return await _call(upstreams, call, offered)
    found = offered.get(call.name)
    with spans.tool(call, found.server if found is not None else None) as span:
        result = await _call(upstreams, call, offered)
        spans.tool_result(span, result)
        return result


async def declined(call: m.ToolCall) -> m.ToolResult:
    """The result of a call the user declined."""
    return m.ToolResult(call_id=call.id, name=call.name, content=DECLINED, ok=False)


async def _call(
    upstreams: Upstreams, call: m.ToolCall, offered: dict[str, UpstreamTool]
) -> m.ToolResult:
    tool = offered.get(call.name)
    if tool is None:
        names = ", ".join(sorted(offered)) or "none"
        why = f"Error: no tool named {call.name}; the tools are: {names}"
        return m.ToolResult(call_id=call.id, name=call.name, content=why, ok=False)
    args, why = hygiene.check_arguments(call.arguments, tool.tool.input_schema or {})
    if args is None:
        return m.ToolResult(call_id=call.id, name=call.name, content=f"Error: {why}", ok=False)
    return await upstreams.call(call, args, tool)
