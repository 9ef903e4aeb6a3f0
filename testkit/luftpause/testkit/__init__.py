"""The test kit: an engine simulator, a fake MCP tool server, load generators and stack
launchers, for tests, benchmarks and the demo stack. The services never import it."""
