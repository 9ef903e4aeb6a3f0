"""luftpause runtime: the MCP server that runs durable sub-agents.

`core/` is the pure core (a run's state machine, the journal's records and replay, budgets,
prices and forecasts, attention, compaction: values in, values out); beside it the shell, one
room per capability: `loop/` (the run loop: runs, tool calls, model turns), `journal/` (where the
journal is kept, leased and shared, and runs moved), `plans/` (prices, forecasts, budget trips),
`people/` (approvals and whom to ask), `context/` (the context wall), `server/` (the MCP tools and
HTTP routes). `main` is `luftpause runtime`: it wires them together. `docs/architecture.md`
names every module by its room.
"""
