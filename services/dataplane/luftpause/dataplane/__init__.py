"""The dataplane: the OpenAI-compatible proxy. Each turn is admitted by the scheduler (or
placed on an open replica), proxied to the replica named and streamed back unchanged."""
