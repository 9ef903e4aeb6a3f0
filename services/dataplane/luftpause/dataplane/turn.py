"""One turn's bookkeeping: its events in order, exactly one end, the run table kept current.

Shell-side helper with no I/O of its own: events go to the link's queue (`report` never
blocks) and, with tracing on, to the turn's span; state to the pure `RunTable` and
`ToolCallMemory`, counts to `Metrics`.

Lifecycle and the events it reports::

    HELD --placed--> PLACED --started--> STARTED --first_token--> (STARTED)
      |                 |                   |
      | close()         | failed / close()  | finished / failed / close()
      v                 v                   v
    ENDED (abandoned)  ENDED (failed)      ENDED (finished | failed)

`rejected` ends a turn the scheduler never recorded (unknown model) without any event.
`close` is called in a `finally` by the proxy, so a cancelled handler (the client went away)
still ends its turn: abandoned while held, failed once placed. Cancelling the Admit call
already drops a held turn at the scheduler; the abandoned event is sent as well because the
cancel may cross the placement on the wire, and then it frees the slot (the scheduler treats
abandoned for a placed turn as its end and ignores it for a turn it no longer knows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum, auto
from typing import TYPE_CHECKING

from luftpause.common import ratelimits
from luftpause.common.keys import KeyEntry
from luftpause.dataplane import wire
from luftpause.dataplane.identity import ServiceClass, ToolCallMemory
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.reply import ReplySummary
from luftpause.dataplane.runs import RunTable, TurnRecord

if TYPE_CHECKING:
    from luftpause.dataplane.spans import TurnSpan


class State(Enum):
    HELD = auto()
    PLACED = auto()
    STARTED = auto()
    ENDED = auto()


class Turn:
    """A turn from its Admit call to its reported end."""

    __slots__ = (
        "_clock",
        "_first_token_sent",
        "_memory",
        "_metrics",
        "_report",
        "_runs",
        "_sent_at",
        "caller",
        "key",
        "model",
        "reading",
        "replica_id",
        "request_bytes",
        "response_bytes",
        "run_id",
        "service_class",
        "single_pass",
        "span",
        "state",
        "turn_id",
    )

    def __init__(
        self,
        *,
        turn_id: str,
        run_id: str,
        model: str,
        service_class: ServiceClass,
        caller: str,
        request_bytes: int,
        report: wire.Report,
        runs: RunTable,
        memory: ToolCallMemory,
        metrics: Metrics,
        clock: Callable[[], float],
        single_pass: bool = False,
        span: TurnSpan | None = None,
        key: KeyEntry | None = None,
    ) -> None:
        self.turn_id = turn_id
        # With tracing on, the turn's span (`spans`): it records the events reported.
        self.span = span
        # A single-pass turn (/v1/decide on a classifier) is outside run state: empty run id,
        # never in the run table (so not in a Resync: it lasts milliseconds).
        self.single_pass = single_pass
        self.run_id = run_id
        self.model = model
        self.service_class = service_class
        self.caller = caller
        # The key of the keys file the turn came with, whose budget it is admitted against.
        self.key = key
        self.request_bytes = request_bytes
        self.response_bytes = 0
        self.replica_id = ""
        # The reply's rate-limit headers: the reading, when (clock) they came, and whether the
        # reply was a 429. Reported with the turn's end.
        self.reading: tuple[ratelimits.Reading, float, bool] | None = None
        self.state = State.HELD
        self._first_token_sent = False
        self._sent_at = 0.0
        self._report = report
        self._runs = runs
        self._memory = memory
        self._metrics = metrics
        self._clock = clock

    def placed(self, replica_id: str) -> None:
        """The scheduler placed the turn: the run is generating there."""
        self._expect(State.HELD)
        self.replica_id = replica_id
        self.state = State.PLACED
        if self.single_pass:
            return
        self._runs.turn_placed(
            TurnRecord(
                turn_id=self.turn_id,
                run_id=self.run_id,
                replica_id=replica_id,
                model=self.model,
                service_class=self.service_class,
                caller=self.caller,
                request_bytes=self.request_bytes,
            ),
            self._clock(),
        )

    def started(self) -> None:
        """The request is going to the engine now."""
        self._expect(State.PLACED)
        self.state = State.STARTED
        self._sent_at = self._clock()
        self._report(wire.started(self.turn_id, self.run_id), self.replica_id)
        if self.span is not None:
            self.span.event("started")

    def first_token(self) -> None:
        """The engine sent its first token (reported once)."""
        if self.state is State.STARTED and not self._first_token_sent:
            self._first_token_sent = True
            if not self.single_pass:
                self._runs.turn_read(self.turn_id)
            after = self._clock() - self._sent_at
            self._report(wire.first_token(self.turn_id, self.run_id, after), self.replica_id)
            if self.span is not None:
                self.span.event("first_token")

    def calls_seen(self, ids: Sequence[str]) -> None:
        """The reply carries these tool calls: remember them now, before the bytes that carry
        them reach the client, whose next request echoes them (as soon as a stream's last
        event arrives, before the engine's end of stream is read and the turn `finished`)."""
        if ids and not self.single_pass:
            self._memory.remember(ids, self.run_id, self._clock())

    def finished(self, summary: ReplySummary) -> None:
        """The reply arrived whole; a reply with tool calls pauses the run."""
        self._expect(State.STARTED)
        self.state = State.ENDED
        now = self._clock()
        if not self.single_pass:
            if summary.tool_call_ids:
                self._memory.remember(summary.tool_call_ids, self.run_id, now)
            self._runs.turn_ended(self.turn_id, tool_paused=summary.tool_calls, now=now)
        event = wire.finished(self.turn_id, self.run_id, summary, self._limits())
        self._report(event, self.replica_id)
        if self.span is not None:
            self.span.finished(summary)
        self._count("finished")

    def failed(self, reason: str, *, retried: bool = False) -> None:
        """The placed turn failed: its slot is freed and the run left idle."""
        if self.state not in (State.PLACED, State.STARTED):
            return
        self.state = State.ENDED
        if not self.single_pass:
            self._runs.turn_ended(self.turn_id, tool_paused=False, now=self._clock())
        self._report(
            wire.failed(self.turn_id, self.run_id, reason, self._limits()), self.replica_id
        )
        if self.span is not None:
            self.span.failed(reason)
        self._count("retried" if retried else "failed")

    def read_limits(self, reading: ratelimits.Reading | None, *, refused: bool) -> None:
        """Keep the reply's rate-limit reading, to report with the turn's end."""
        if reading is not None:
            self.reading = (reading, self._clock(), refused)

    def _limits(self) -> wire.LimitsMessage | None:
        if self.reading is None:
            return None
        reading, at, refused = self.reading
        now = self._clock()
        return wire.rate_limits(
            reading, (now - at) * 1000.0, (now - self._sent_at) * 1000.0, refused=refused
        )

    def rejected(self) -> None:
        """The scheduler refused the turn outright; it never existed there."""
        self._expect(State.HELD)
        self.state = State.ENDED

    def close(self, reason: str) -> None:
        """End the turn if nothing else did: abandoned while held, failed once placed."""
        if self.state is State.HELD:
            self.state = State.ENDED
            self._report(wire.abandoned(self.turn_id, self.run_id), self.replica_id)
            if self.span is not None:
                self.span.event("abandoned")
            self._count("abandoned")
        elif self.state is not State.ENDED:
            self.failed(reason)

    def _expect(self, state: State) -> None:
        if self.state is not state:
            raise RuntimeError(f"turn {self.turn_id}: {self.state.name}, expected {state.name}")

    def _count(self, outcome: str) -> None:
        self._metrics.turn(self.service_class, outcome, self.request_bytes, self.response_bytes)
