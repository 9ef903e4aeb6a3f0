"""The scheduler's decision core: `decide(state, event) -> (state, actions)`, pure (no I/O,
no clock, no randomness). `state` holds the `State` and its `Draft`; each other module owns one
part of the rules or one index (see `state`'s docstring)."""
