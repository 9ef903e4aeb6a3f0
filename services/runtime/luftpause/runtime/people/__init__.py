"""People and approvals: a tool call that waits for a person's yes, and how they are asked.

`approvals` holds the calls waiting for an answer and journals each answer; `question_gate`
decides whom may be asked which question now (the attention budget of `core.attention`, the away
switches); `elicitation` asks it inside an `await` or `run` call (MCP elicitation, or an
input-required result).
"""
