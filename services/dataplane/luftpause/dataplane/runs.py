"""The dataplane's own record of runs and turns in flight: the truth it resyncs to the scheduler.

Pure module: no I/O; time arrives as an argument (monotonic seconds). The proxy updates the
table as turns go (placed, ended, run ended); the scheduler link snapshots it for `Resync`.

A run is GENERATING while any of its turns is in flight, TOOL_PAUSED after a reply that ended in
tool calls, IDLE after a normal finish or any failure. A run with no turn for 30 minutes is
dropped, as the scheduler does.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from luftpause.dataplane.identity import ServiceClass

RUN_IDLE_SECONDS = 30 * 60


class Phase(IntEnum):
    """Numbered as the proto's RunPhase."""

    IDLE = 1
    GENERATING = 2
    TOOL_PAUSED = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    """A placed turn: from the scheduler's reply until its end is reported."""

    turn_id: str
    run_id: str
    replica_id: str
    model: str
    service_class: ServiceClass
    caller: str
    # The request body's size: what the engine reads for it until its first token comes.
    request_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.turn_id or not self.run_id:
            raise ValueError("a turn needs a turn id and a run id")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """What the dataplane knows of one run; `since` is when its last turn started or ended."""

    run_id: str
    replica_id: str
    phase: Phase
    service_class: ServiceClass
    caller: str
    since: float
    in_flight: int = 0

    def __post_init__(self) -> None:
        if self.in_flight < 0:
            raise ValueError("in_flight must not be negative")
        if (self.in_flight > 0) != (self.phase is Phase.GENERATING):
            raise ValueError("a run is GENERATING exactly while a turn of it is in flight")


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedFile:
    """A slot context file this dataplane saved a run's context to (endpoint `slot_saves`)."""

    replica_id: str
    file: str
    run_id: str
    saved_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Runs (with their idle seconds), turns in flight, and saved slot files (with their age),
    as sent in a Resync."""

    runs: tuple[tuple[RunRecord, float], ...]
    turns: tuple[TurnRecord, ...]
    saved: tuple[tuple[SavedFile, float], ...] = ()


class RunTable:
    """Runs by id and turns in flight by id, updated as turns go; and the slot context files
    this dataplane saved and has not restored since, which a restarted scheduler learns back
    from the Resync."""

    __slots__ = ("idle_limit", "load", "pending", "read", "runs", "saved", "turns")

    def __init__(self, idle_limit: float = RUN_IDLE_SECONDS) -> None:
        self.idle_limit = idle_limit
        self.runs: dict[str, RunRecord] = {}
        self.turns: dict[str, TurnRecord] = {}
        # Replica id -> turns of ours in flight there (no entry for none), and the request
        # bytes of those that have not shown a first token yet: reading queued there.
        self.load: dict[str, int] = {}
        self.pending: dict[str, int] = {}
        self.read: set[str] = set()  # turns in flight whose first token came
        # (replica id, file) -> what it holds, as this dataplane last wrote it.
        self.saved: dict[tuple[str, str], SavedFile] = {}

    def slot_saved(self, replica_id: str, file: str, run_id: str, now: float) -> None:
        """`file` on the replica's engine now holds `run_id`'s context."""
        self.saved[(replica_id, file)] = SavedFile(
            replica_id=replica_id, file=file, run_id=run_id, saved_at=now
        )

    def slot_restored(self, replica_id: str, file: str) -> None:
        """`file`'s context went back into a slot: the scheduler counts the file free again."""
        self.saved.pop((replica_id, file), None)

    def turn_placed(self, turn: TurnRecord, now: float) -> None:
        """The scheduler placed `turn`: its run is generating on that replica."""
        if turn.turn_id in self.turns:
            raise ValueError(f"turn {turn.turn_id} is already placed")
        self.turns[turn.turn_id] = turn
        self.load[turn.replica_id] = self.load.get(turn.replica_id, 0) + 1
        self._pend(turn.replica_id, turn.request_bytes)
        old = self.runs.get(turn.run_id)
        self.runs[turn.run_id] = RunRecord(
            run_id=turn.run_id,
            replica_id=turn.replica_id,
            phase=Phase.GENERATING,
            service_class=turn.service_class,
            caller=turn.caller,
            since=now,
            in_flight=(old.in_flight if old else 0) + 1,
        )

    def turn_read(self, turn_id: str) -> None:
        """A turn's first token came: the engine has read its prompt."""
        turn = self.turns.get(turn_id)
        if turn is not None and turn_id not in self.read:
            self.read.add(turn_id)
            self._pend(turn.replica_id, -turn.request_bytes)

    def turn_ended(self, turn_id: str, *, tool_paused: bool, now: float) -> None:
        """A turn finished (paused on a tool or not) or failed."""
        turn = self.turns.pop(turn_id, None)
        if turn is None:
            return
        if turn_id in self.read:
            self.read.discard(turn_id)
        else:
            self._pend(turn.replica_id, -turn.request_bytes)
        left = self.load.pop(turn.replica_id) - 1
        if left:
            self.load[turn.replica_id] = left
        run = self.runs.get(turn.run_id)
        if run is None:
            return
        in_flight = max(run.in_flight - 1, 0)
        paused = Phase.TOOL_PAUSED if tool_paused else Phase.IDLE
        phase = Phase.GENERATING if in_flight else paused
        self.runs[run.run_id] = RunRecord(
            run_id=run.run_id,
            replica_id=run.replica_id,
            phase=phase,
            service_class=run.service_class,
            caller=run.caller,
            since=now,
            in_flight=in_flight,
        )

    def _pend(self, replica_id: str, delta: int) -> None:
        left = self.pending.get(replica_id, 0) + delta
        if left > 0:
            self.pending[replica_id] = left
        else:
            self.pending.pop(replica_id, None)

    def end_run(self, run_id: str) -> None:
        """Forget a run that its agent declared over; its turns in flight still end normally."""
        self.runs.pop(run_id, None)

    def phase(self, run_id: str) -> Phase | None:
        """The run's phase, or None if unknown."""
        run = self.runs.get(run_id)
        return run.phase if run else None

    def prune(self, now: float) -> int:
        """Drop runs with no turn for `idle_limit` seconds; return how many went."""
        stale = [r.run_id for r in self.runs.values() if self._expired(r, now)]
        for run_id in stale:
            del self.runs[run_id]
        return len(stale)

    def snapshot(self, now: float) -> Snapshot:
        """Everything to resync, idle runs past the limit left out."""
        runs = tuple(
            (run, max(now - run.since, 0.0))
            for run in self.runs.values()
            if not self._expired(run, now)
        )
        saved = tuple((f, max(now - f.saved_at, 0.0)) for f in self.saved.values())
        return Snapshot(runs=runs, turns=tuple(self.turns.values()), saved=saved)

    def _expired(self, run: RunRecord, now: float) -> bool:
        return run.in_flight == 0 and now - run.since > self.idle_limit
