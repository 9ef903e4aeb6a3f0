"""A tiny MCP tool server over stdio for the runtime's tests: `python stdio_tools.py`.

`shout` answers at once with its input in capitals; `leave` ends the process without answering
(a server that exits between calls).
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("stdio-tools")


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return f"SHOUTED {text.upper()}"


@server.tool()
def leave() -> str:
    """Exit the process at once, without an answer."""
    os._exit(0)


if __name__ == "__main__":
    server.run("stdio")
