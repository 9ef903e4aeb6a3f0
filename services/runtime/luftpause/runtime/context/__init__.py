"""The context wall: a run's history made to fit its model's context window.

`windows` knows each model's window (flags, the engine's `GET /v1/models`, a refusal); `wall`
compacts a run's history before a turn that would not fit, and after an engine refused one. What
to replace is the core's `compaction`.
"""
