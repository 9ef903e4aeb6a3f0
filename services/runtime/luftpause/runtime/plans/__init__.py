"""Plans and budgets, the shell: prices, what runs spent, forecasts and the budgets' timers.

`planner` prices a run at spawn, answers the `forecast` tool and looks one turn ahead for a
seconds budget; it learns from the journal through `observed_journal` and reads the scheduler's
rate-limit windows through `scheduler_status`. `budget_guard` trips the budgets of the runs
driven here: after every step, on spawn, and by a timer per seconds budget. The arithmetic is
the core's (`core.budget`, `core.price_table`, `core.forecast` and its neighbours).
"""
