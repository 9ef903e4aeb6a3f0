"""The runtime's face: the MCP server and its HTTP routes.

`app` builds the MCP server (the tools spawn, await, run, status, forecast, cancel, approve,
decide, tools; GET /status, /health, /ready, /metrics), taking spawn's and run's arguments as one
record (`arguments`); `tasks` is the MCP Tasks extension for `run`; `auth` the bearer auth and
`cors` the CORS of /status; `readiness` asks the dataplane whether it is ready; `metrics` are the
Prometheus metrics.
"""
