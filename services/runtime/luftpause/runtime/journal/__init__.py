"""Where the journal is kept, and runs moved: the records themselves are `core.journal`'s.

`file` is the journal file `runs.jsonl` (and `Store`, what the runtime needs of any journal);
`postgres` the same records in a database shared by several replicas, `leases` who drives each
unfinished run there, `fleet` one replica's loops over it. `moves` forks, exports and imports
runs (their formats are `core.forks` and `core.bundle`); `move_tools` are its MCP tools and HTTP
routes.
"""
