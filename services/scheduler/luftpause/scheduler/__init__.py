"""The scheduler: decides where each turn goes and probes the engines.

`core/` is the pure decision core (`decide(state, event) -> (state, actions)`); the rest is its
shell: the gRPC host and session stream (`rpc`, `wire`, `host`), the prober, the status page and
metrics.
"""
