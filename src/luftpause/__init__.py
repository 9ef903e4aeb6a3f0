"""luftpause: the runtime layer under agent harnesses.

One package, three services and what they share:

- `luftpause.cli`: the `luftpause` command (every subcommand below is one of its words);
- `luftpause.up`: `luftpause up`, the local stack as child processes;
- `luftpause.scheduler`: where each turn goes (a pure decision core and its gRPC shell);
- `luftpause.dataplane`: the OpenAI-compatible proxy every turn goes through;
- `luftpause.runtime`: the MCP server that runs durable sub-agents;
- `luftpause.common`: the endpoint file, auth, tracing, logs and process supervision;
- `luftpause.rpc`: the gRPC code generated from proto/ (`make proto`);
- `luftpause.testkit`: the engine simulator, a fake MCP tool server and load generators, for
  tests, benchmarks and the demo stack (the services never import it).
"""
