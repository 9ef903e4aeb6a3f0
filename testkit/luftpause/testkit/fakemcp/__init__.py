"""A fake MCP tool server for tests: `luftpause fake-mcp`.

Layers: `core` is pure (filler text, latencies, call counts); `server` is the shell (argv, the
`mcp` SDK's `MCPServer` over Streamable HTTP, uvicorn, signals) and may import `core`.
"""

from luftpause.testkit.fakemcp.server import main

__all__ = ["main"]
