"""A tiny MCP tool server over stdio for the runtime's tests: `python stdio_tools.py`.

Its one tool, `shout`, answers at once with its input in capitals.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("stdio-tools")


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return f"SHOUTED {text.upper()}"


if __name__ == "__main__":
    server.run("stdio")
