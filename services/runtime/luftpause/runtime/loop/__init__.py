"""The run loop: each run an asyncio task that asks the state machine (`core.machine`) what to
do next and does it.

`runtime` holds every run (spawn, drive, await, cancel, resume); `rounds` settles a round's tool
calls, one each through `toolcalls`, over the upstream MCP sessions (`upstream`, on `outbound`'s
HTTP transport); `llm` takes the model turns through the dataplane; `spans` traces runs, turns
and tool calls; `failpoints` are the crash points of the fault tests.
"""
