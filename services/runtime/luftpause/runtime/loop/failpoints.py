"""Crash points for the fault tests: the runtime kills itself with SIGKILL at a named moment.

Shell module (a signal to its own process). `LUFTPAUSE_FAILPOINT` names one point; unset (as
in production) every `hit` is one string comparison. The points are moments an outside SIGKILL
cannot aim at, because nothing outside the process can see them:

    before-send    a tool call is about to be journaled as sent (nothing of it has left)
    after-result   a tool call's result has arrived and is not yet journaled

The tests in `tests/integration/test_tool_faults.py` start a runtime with one set, and start
it again without it.
"""

from __future__ import annotations

import os
import signal

import structlog

ENV = "LUFTPAUSE_FAILPOINT"
BEFORE_SEND = "before-send"
AFTER_RESULT = "after-result"
POINTS = frozenset({BEFORE_SEND, AFTER_RESULT})

log = structlog.get_logger(service="runtime")


def armed() -> str | None:
    """The point `LUFTPAUSE_FAILPOINT` names, None when unset; ValueError for an unknown one."""
    point = os.environ.get(ENV) or None
    if point is not None and point not in POINTS:
        raise ValueError(f"{ENV} must be one of {', '.join(sorted(POINTS))}, got {point!r}")
    return point


_ARMED = os.environ.get(ENV) or None  # checked by `luftpause runtime` on start (`armed`)


def hit(point: str) -> None:
    """Die here with SIGKILL if `point` is the armed one."""
    if point == _ARMED:
        log.warning("failpoint.hit", point=point)
        os.kill(os.getpid(), signal.SIGKILL)
