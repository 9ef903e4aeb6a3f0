"""Events into the decision core and the actions it returns.

Pure module: frozen values only. Time arrives as the `at` field of every event (seconds on the
shell's monotonic clock); the core never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.common.prefixes import Key
from luftpause.common.ratelimits import Reading
from luftpause.scheduler.core.model import KeyLimits, Phase, ServiceClass, _check_id

# --- events --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Admit:
    """A dataplane asks where a turn goes. `single_pass` turns never touch run state.

    With `placed_on` set, the dataplane already sent the turn to that open replica (see
    `placement.is_open`): the core records the placement as it stands and answers nothing.
    """

    at: float
    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass = ServiceClass.INTERACTIVE
    caller: str = ""
    dataplane: str = ""
    single_pass: bool = False
    placed_on: str = ""
    # Size of the request body: sizes a new run's first turn before its usage is known.
    prompt_bytes: int = 0
    # The request's opening keys (`common.prefixes`): a new run goes where they were served.
    opening: tuple[Key, ...] = ()
    # Its max_tokens (0: none), its caller key's budget, and the wall clock (Unix seconds): see
    # `gate` (turns to rate-limited replicas, and keys with budgets).
    max_tokens: int = 0
    key: KeyLimits | None = None
    wall_at: float = 0.0

    def __post_init__(self) -> None:
        _check_id("turn id", self.turn_id)
        if not self.single_pass:
            _check_id("run id", self.run_id)
        if self.placed_on and self.single_pass:
            raise ValueError("a single-pass turn is never placed by its dataplane")


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnStarted:
    at: float
    turn_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstToken:
    at: float
    turn_id: str
    # Seconds from its request's start to this token as the dataplane measured them (0: not
    # measured; the event's own arrival then stands for the token's time).
    after_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFinished:
    at: float
    turn_id: str
    tool_calls: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str = ""
    # The reply's rate-limit headers, when they arrived and when its request went to the
    # engine (on the `at` clock; the provider's count is as of then).
    reading: Reading | None = None
    reading_at: float = 0.0
    reading_sent_at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFailed:
    at: float
    turn_id: str
    reason: str = ""
    # A refusal's rate-limit headers (a 429: `refused`) and when they arrived.
    reading: Reading | None = None
    reading_at: float = 0.0
    reading_sent_at: float = 0.0
    refused: bool = False


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
    # The engine's KV pool and the tokens its batch holds, when its metrics say; the most
    # requests it runs at once, when it says (SGLang's /server_info).
    kv_total: int | None = None
    kv_used: int | None = None
    max_running: int | None = None


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
class SavedSlot:
    """A saved slot context file a dataplane wrote: `file` (as placements name it) on `replica`
    holds `run_id`'s context, saved `age_s` seconds ago."""

    replica: str
    file: str
    run_id: str
    age_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Resync:
    """A dataplane's whole truth: its runs and its turns in flight replace what we had; the
    save files it wrote fill the ones this scheduler knows nothing of (after a restart)."""

    at: float
    dataplane: str
    runs: tuple[RunSnapshot, ...] = ()
    turns: tuple[TurnSnapshot, ...] = ()
    saved: tuple[SavedSlot, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DataplaneConnected:
    """A dataplane opened an event stream (or resynced)."""

    at: float
    dataplane: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DataplaneDisconnected:
    """One of a dataplane's event streams ended."""

    at: float
    dataplane: str


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
    | DataplaneConnected
    | DataplaneDisconnected
)


# --- actions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Place:
    """Send turn `turn_id` to replica `replica_id`."""

    turn_id: str
    replica_id: str
    replica_url: str
    held_s: float
    # The request's `priority` for the replica's engine; None sends none.
    engine_priority: int | None = None
    # The engine slot (llama.cpp `id_slot`) the request names; None lets the engine pick.
    engine_slot: int | None = None
    # Before the request, save the slot's content to this file of the engine, then restore the
    # run's context from that one (endpoint `slot_saves`); None for neither.
    slot_save: str | None = None
    slot_restore: str | None = None
    # With `slot_save`: the run whose context the slot holds (the dataplane remembers the file).
    slot_save_run: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject:
    """Refuse the turn at once: no replica serves its model (`not_found`), or it can never fit
    a rate-limit window (`rate_limited`, try again after `retry_after_s`)."""

    turn_id: str
    message: str
    code: str = "not_found"
    retry_after_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnExpired:
    turn_id: str
    replica_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunExpired:
    run_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DataplaneReleased:
    """A dataplane stayed away past the grace period: its turns in flight were freed."""

    dataplane: str
    turns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTaken:
    """A turn of the run came through another dataplane than its last one: that one forgets
    the run, so it never places the run's turns itself by the replica it last saw."""

    dataplane: str
    run_id: str


Action = Place | Reject | TurnExpired | RunExpired | DataplaneReleased | RunTaken
