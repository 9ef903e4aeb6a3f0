"""Values of the scheduler's decision core: state records, events in, actions out.

Pure module: no I/O, no clock reads, no awaits. Every record is frozen and checks its input
when built. Time arrives as the `at` field of an event (seconds on the shell's monotonic clock).

State is a handful of persistent maps (`immutables.Map`, a HAMT): an update copies O(log n)
nodes, so keeping the old state around costs nothing and an event never walks all runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import immutables

from luftpause.common.config import EndpointKind

TURN_TIMEOUT_S = 600.0
"""A placed turn whose end is never reported is dropped after this (dataplane died mid-turn)."""

RUN_IDLE_EXPIRY_S = 1800.0
"""A run with no turn for this long is forgotten; its next turn starts without affinity."""


class ServiceClass(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class Phase(StrEnum):
    IDLE = "idle"
    GENERATING = "generating"
    TOOL_PAUSED = "tool_paused"


def _check_id(name: str, value: str) -> None:
    if not value:
        raise ValueError(f"{name} must not be empty")


# --- state ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Replica:
    """One endpoint of the pool as the scheduler sees it."""

    id: str
    url: str
    models: frozenset[str]
    kind: EndpointKind = EndpointKind.GENERATIVE
    healthy: bool = False
    # What the engine last reported on /metrics; None when it reports nothing.
    engine_running: int | None = None
    engine_waiting: int | None = None
    # Turns placed here and not yet finished (our own count, exact).
    in_flight: int = 0
    # Interactive runs paused on a tool here: batch leaves one slot for each.
    paused_interactive: int = 0

    def __post_init__(self) -> None:
        _check_id("replica id", self.id)
        if self.in_flight < 0 or self.paused_interactive < 0:
            raise ValueError(f"replica {self.id}: negative counts")

    @property
    def capacity(self) -> int | None:
        """Turn cap: none while the engine reports no queue; once it queues, what it runs."""
        if not self.engine_waiting:
            return None
        return max(self.engine_running or 0, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """An agent run: the replica that holds its prefix and what it is doing."""

    id: str
    replica: str = ""
    phase: Phase = Phase.IDLE
    service_class: ServiceClass = ServiceClass.INTERACTIVE
    caller: str = ""
    turns_in_flight: int = 0
    last_active: float = 0.0
    # The run was ended while a turn was in flight: forget it when that turn ends.
    ended: bool = False

    def __post_init__(self) -> None:
        _check_id("run id", self.id)
        if self.turns_in_flight < 0:
            raise ValueError(f"run {self.id}: negative turns in flight")

    @property
    def pinned(self) -> bool:
        """Generating or paused on a tool: its next turn must go to its replica."""
        return bool(self.replica) and self.phase is not Phase.IDLE


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """A placed turn, in flight on a replica."""

    id: str
    run_id: str
    replica: str
    model: str
    service_class: ServiceClass
    caller: str
    placed_at: float
    dataplane: str = ""
    single_pass: bool = False

    def __post_init__(self) -> None:
        _check_id("turn id", self.id)
        _check_id("turn replica", self.replica)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldTurn:
    """A turn waiting in the scheduler for room."""

    id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    arrived_at: float
    seq: int
    dataplane: str = ""
    single_pass: bool = False

    def __post_init__(self) -> None:
        _check_id("turn id", self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class State:
    """Everything the scheduler knows. Replaced, never mutated."""

    replicas: immutables.Map[str, Replica] = field(default_factory=immutables.Map)
    # model -> replica ids serving it (generative and single-pass apart), fixed by config.
    generative_by_model: immutables.Map[str, tuple[str, ...]] = field(
        default_factory=immutables.Map
    )
    single_pass_by_model: immutables.Map[str, tuple[str, ...]] = field(
        default_factory=immutables.Map
    )
    runs: immutables.Map[str, Run] = field(default_factory=immutables.Map)
    turns: immutables.Map[str, Turn] = field(default_factory=immutables.Map)
    held: immutables.Map[str, HeldTurn] = field(default_factory=immutables.Map)
    caller_in_flight: immutables.Map[str, int] = field(default_factory=immutables.Map)
    next_seq: int = 0
    now: float = 0.0


# --- events --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Admit:
    """A dataplane asks where a turn goes. `single_pass` turns never touch run state."""

    at: float
    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass = ServiceClass.INTERACTIVE
    caller: str = ""
    dataplane: str = ""
    single_pass: bool = False

    def __post_init__(self) -> None:
        _check_id("turn id", self.turn_id)
        if not self.single_pass:
            _check_id("run id", self.run_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnStarted:
    at: float
    turn_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstToken:
    at: float
    turn_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFinished:
    at: float
    turn_id: str
    tool_calls: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFailed:
    at: float
    turn_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnAbandoned:
    """The client left: a held turn leaves the queue; a placed one counts as failed."""

    at: float
    turn_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnded:
    at: float
    run_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    at: float
    replica_id: str
    healthy: bool
    running: int | None = None
    waiting: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSnapshot:
    run_id: str
    replica: str
    phase: Phase
    service_class: ServiceClass
    caller: str
    idle_seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnSnapshot:
    turn_id: str
    run_id: str
    replica: str
    model: str
    service_class: ServiceClass
    caller: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Resync:
    """A dataplane's whole truth: its runs and its turns in flight replace what we had."""

    at: float
    dataplane: str
    runs: tuple[RunSnapshot, ...] = ()
    turns: tuple[TurnSnapshot, ...] = ()


Event = (
    Admit
    | TurnStarted
    | FirstToken
    | TurnFinished
    | TurnFailed
    | TurnAbandoned
    | RunEnded
    | ProbeResult
    | Tick
    | Resync
)


# --- actions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Place:
    """Send turn `turn_id` to replica `replica_id`."""

    turn_id: str
    replica_id: str
    replica_url: str
    held_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject:
    """Refuse the turn at once (no replica serves its model)."""

    turn_id: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnExpired:
    turn_id: str
    replica_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunExpired:
    run_id: str


Action = Place | Reject | TurnExpired | RunExpired
