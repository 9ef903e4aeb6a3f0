"""One single-pass turn's bookkeeping (`/v1/decide` on a classifier): events, exactly one end.

Shell-side helper with no I/O of its own, the single-pass counterpart of `turn.Turn`. A
single-pass turn is outside run state: it is admitted with `single_pass` and an empty run id,
its events carry an empty run id (the scheduler finds the turn by its id), and it never enters
the run table, so it is not part of a Resync (it lasts milliseconds; a scheduler that restarts
during one under-counts that replica for as long).

    HELD --placed--> PLACED --started--> STARTED --finished / failed--> ENDED
    HELD --close()--> ENDED (abandoned);  PLACED / STARTED --close()--> ENDED (failed)
"""

from __future__ import annotations

from collections.abc import Callable

from luftpause.dataplane import wire
from luftpause.dataplane.identity import ServiceClass
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.reply import ReplySummary
from luftpause.dataplane.turn import State
from luftpause.rpc import scheduler_pb2 as pb


class SinglePassTurn:
    """A single-pass turn from its Admit call to its reported end."""

    __slots__ = (
        "_metrics",
        "_report",
        "replica_id",
        "request_bytes",
        "response_bytes",
        "service_class",
        "state",
        "turn_id",
    )

    run_id = ""  # outside run state

    def __init__(
        self,
        *,
        turn_id: str,
        request_bytes: int,
        report: Callable[[pb.TurnEvent], None],
        metrics: Metrics,
        service_class: ServiceClass = ServiceClass.INTERACTIVE,
    ) -> None:
        self.turn_id = turn_id
        self.request_bytes = request_bytes
        self.response_bytes = 0
        self.service_class = service_class
        self.replica_id = ""
        self.state = State.HELD
        self._report = report
        self._metrics = metrics

    def placed(self, replica_id: str) -> None:
        self._expect(State.HELD)
        self.replica_id = replica_id
        self.state = State.PLACED

    def started(self) -> None:
        self._expect(State.PLACED)
        self.state = State.STARTED
        self._report(wire.started(self.turn_id, ""))

    def finished(self, summary: ReplySummary) -> None:
        self._expect(State.STARTED)
        self.state = State.ENDED
        self._report(wire.finished(self.turn_id, "", summary))
        self._count("finished")

    def failed(self, reason: str) -> None:
        if self.state not in (State.PLACED, State.STARTED):
            return
        self.state = State.ENDED
        self._report(wire.failed(self.turn_id, "", reason))
        self._count("failed")

    def rejected(self) -> None:
        self._expect(State.HELD)
        self.state = State.ENDED

    def close(self, reason: str) -> None:
        """End the turn if nothing else did: abandoned while held, failed once placed."""
        if self.state is State.HELD:
            self.state = State.ENDED
            self._report(wire.abandoned(self.turn_id, ""))
            self._count("abandoned")
        elif self.state is not State.ENDED:
            self.failed(reason)

    def _expect(self, state: State) -> None:
        if self.state is not state:
            raise RuntimeError(f"turn {self.turn_id}: {self.state.name}, expected {state.name}")

    def _count(self, outcome: str) -> None:
        self._metrics.turn(self.service_class, outcome, self.request_bytes, self.response_bytes)
