"""The runtime's pure core: values in, values out; no I/O, no clock, no awaits, no randomness.

A run is a state machine (`machine`, its events and decisions in `steps`, its values in
`values`); the journal is its records and their replay (`journal`, the records that begin runs
in `forks`, a run carried elsewhere in `bundle`, what leaves it in `retention`); a tool call sent
with no answer goes by `resend`'s rule, a model's tool arguments by `hygiene`'s. Budgets and
plans: `budget` (a subtree's use against its limits), `price` and `price_table` (what tokens
cost), `turn_samples` (what the journal taught of each run and model), `turn_estimates` (one
quantity of the next turns from those samples), `rate_waits` (the scheduler's rate-limit windows
played forward), `forecast` (a run's rest projected), `forecast_view` (its inputs and its
answer), `lookahead` (a seconds budget that looks one turn ahead), `status_tree` (the run tree of
GET /status). People: `attention` (how many questions a person may be asked), `owners` (which key
a run belongs to). Context: `compaction` (what to replace so a turn fits). `errors` is the
runtime's exception tree. The shell around it is the rest of `luftpause.runtime`; nothing here
imports it (`tests/test_layout.py` holds the rule).
"""
