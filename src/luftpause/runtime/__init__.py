"""luftpause runtime: the MCP server that runs durable sub-agents."""
