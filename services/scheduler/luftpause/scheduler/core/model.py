"""Records of the scheduler's decision core: replicas, runs, turns, held turns, links.

Pure module: no I/O, no clock reads, no awaits. Every record is frozen and checks its input
when built; `evolve` makes a changed copy without re-running those checks (the core only
evolves records it built itself, and the property tests check the derived fields). Unlike
events and actions, records have no `slots`: see `evolve`. The state that holds them is in
`state`. A few fields of a replica and a run are derived (counted from the turns and runs by
`counters` and `residency`, which own them); the comments say which.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, fields
from enum import StrEnum
from typing import Any, TypeVar

from luftpause.common.config import EndpointKind, Priorities
from luftpause.common.prefixes import Key
from luftpause.scheduler.core.learned import PrefillFit

TURN_TIMEOUT_S = 600.0
"""A placed turn whose end is never reported is dropped after this (dataplane died mid-turn)."""

RUN_IDLE_EXPIRY_S = 1800.0
"""A run with no turn for this long is forgotten; its next turn starts without affinity."""

DATAPLANE_GRACE_S = 30.0
"""Default time a dataplane's event streams may be gone before its turns in flight are freed."""

KV_FULL = 0.9
"""An engine that queues while its requests hold this share of its KV pool is shown as bound by
its KV (status only: a batching engine's queue never sets a cap short of its `max_running`)."""

KV_MARGIN_BATCH = 0.75
KV_MARGIN_INTERACTIVE = 0.875
"""A new run goes to a replica only while the footprints of the runs resident there, and its
own, fit in this share of the replica's KV pool (see `residency`). The rest is headroom for the
engine's own cache: it evicts least recently used prefixes, and the prefills of new runs and
of turns that missed push out the oldest ones, which are those of the runs paused longest. With
the working set at 90 % of the pool, half of the paused runs' prefixes were gone when they came
back (bench.flood on a KV-bound simulator, 36k-token pools); at 75 %, a third."""

RESIDENCY_STEP_S = 0.05
"""Resolution of residency expiry: a run leaves its replica's working set within this of when
it was expected back."""

NEW_RUN_MAX_HOLD_S = 60.0
"""A new run held this long by the KV rule goes to any replica with room: nothing starves."""

# The `share` rule (`shares`): an interactive run weighs this many batch runs when the two
# classes share a saturated pool, and the time each class had there fades with SHARE_TAU_S.
# With weight w, batch keeps at least 1 / (1 + (w - 1) f) of what arrival order would give it,
# f being interactive's part of the runs that want the pool: at 1.5, nine tenths while
# interactive runs are a fifth of them or fewer. Interactive runs few beside batch on engines
# that batch dozens of requests never reach the bound; on 2-slot llama.cpp pools strict
# priority gave four of them beside 48 batch runs 4-5x a class-blind router's throughput and
# took 15-35 % of batch's; at 1.5 they get 1.8-1.9x and batch 0.91-0.96x (bench.family, lab).
INTERACTIVE_WEIGHT = 1.5
SHARE_TAU_S = 60.0
# Interactive yields to batch only once it had more than this many turn-seconds beyond its share.
SHARE_SLACK_S = 1.0

Bucket = tuple[str, str, str]
"""Where a held turn may go: ("r", replica, model) for a run pinned or resident there;
("m", "", model) for a new run (or one free to move), which the KV rule may hold; ("o", "",
model) for one the KV rule held past NEW_RUN_MAX_HOLD_S; ("s", "", model) single-pass."""

Chain = tuple[Any, ...] | None
"""A persistent cons list: (head..., rest) or None."""

_R = TypeVar("_R")
_NO_FIT = PrefillFit()


def evolve(record: _R, **changes: Any) -> _R:
    """A copy of a frozen state record with `changes`, without re-validating it.

    Records keep their fields in a `__dict__` (no `slots`) for this: copying a dict is one C
    call, where copying slots is one Python step per field, and a decision copies a few records
    per event. The copy is new: nobody else holds it until it is returned. The dict is copied
    whole and given to the new record (`dict.copy` copies the table at once; updating an empty
    dict with it inserted the fields one by one, twice as long for a replica).
    """
    new = object.__new__(type(record))
    fields_ = record.__dict__.copy()
    fields_.update(changes)
    _SET(new, "__dict__", fields_)
    return new


_SET = object.__setattr__


_PROTOTYPES: dict[type, tuple[dict[str, Any], frozenset[str]]] = {}


def build(cls: type[_R], **values: Any) -> _R:
    """A new state record of `cls` with `values` (every field without a default among them),
    every other field at its default, without running its checks: for records made on every
    event from values already checked (a placed turn from its held turn and replica, a held
    turn from its `Admit`). A frozen dataclass's constructor sets its fields one Python call at
    a time; this copies the fields of a prototype and updates them. The prototype's fields are
    a dict that shares its keys with every record of the class, as a constructor's would: its
    copies hold their values alone (a dict of its own per record took three times the memory,
    which 100,000 held turns paid for in time)."""
    proto = _PROTOTYPES.get(cls) or _prototype(cls)
    fields_, required = proto
    if not values.keys() >= required:
        raise TypeError(f"{cls.__name__} needs {', '.join(sorted(required - values.keys()))}")
    fields_ = fields_.copy()
    fields_.update(values)
    new = object.__new__(cls)
    _SET(new, "__dict__", fields_)
    return new


def _prototype(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    """`cls`'s fields set in their order on a bare record (None where a field has no default),
    and the names of those without one."""
    record: object = object.__new__(cls)
    required = []
    for f in fields(cls):
        if f.default is MISSING:
            required.append(f.name)
        _SET(record, f.name, None if f.default is MISSING else f.default)
    proto = (record.__dict__, frozenset(required))
    _PROTOTYPES[cls] = proto
    return proto


@dataclass(frozen=True, slots=True, kw_only=True)
class Rules:
    """The placement rules the core applies. All are on by default; each can be switched off
    (`luftpause scheduler --without RULE`), which the benchmarks use as ablations:

    - `affinity`: a run generating or paused on a tool goes only to its replica;
    - `soft_affinity`: an idle run resident on its replica waits for it, for a bounded time;
    - `kv_rule`: a new run is held while the replicas' working sets fill their KV pools, and a
      replica's overflow counts in where a new run goes;
    - `openings`: a new run's cost on a replica counts the opening it served there as cached;
    - `headroom`: batch leaves a slot on a capped replica for each interactive run paused on a
      tool there (off by default: it cost batch up to a quarter of its throughput on slot-bound
      engines and gave interactive runs nothing that their place in the queue does not, see
      docs/measurements.md);
    - `share`: held interactive turns go first while their class has had at most
      `interactive_weight` times a batch run's share of its model's replicas lately, and after
      batch beyond it (`shares`); off, interactive always goes first.
    """

    affinity: bool = True
    soft_affinity: bool = True
    kv_rule: bool = True
    openings: bool = True
    headroom: bool = False
    share: bool = True
    # What one interactive run weighs against one batch run in `share` (> 0).
    interactive_weight: float = INTERACTIVE_WEIGHT

    def __post_init__(self) -> None:
        if not self.interactive_weight > 0 or math.isinf(self.interactive_weight):
            raise ValueError(
                f"interactive weight must be a positive number, not {self.interactive_weight}"
            )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The rules that can be switched on and off."""
        return tuple(f.name for f in fields(cls) if f.type in (bool, "bool"))

    def switched(self, names: Iterable[str], *, on: bool) -> Rules:
        """These rules with `names` switched on (or off); ValueError for an unknown name."""
        values = {name: getattr(self, name) for name in self.names()}
        for name in names:
            if name not in values:
                raise ValueError(f"unknown rule {name!r}; one of {', '.join(values)}")
            values[name] = on
        return Rules(**values, interactive_weight=self.interactive_weight)


class ServiceClass(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class Phase(StrEnum):
    IDLE = "idle"
    GENERATING = "generating"
    TOOL_PAUSED = "tool_paused"


def kv_full(replica: Replica, kv_used: int | None) -> bool:
    """Whether requests in `replica`'s batch hold (nearly) all of its KV pool."""
    pool = replica.kv_tokens
    return pool is not None and kv_used is not None and kv_used >= KV_FULL * pool


def next_cap(replica: Replica, running: int | None, waiting: int | None) -> int | None:
    """`replica`'s turn cap after a probe saw its engine run `running` and queue `waiting`.

    An engine whose KV pool is known (`kv_tokens`) batches up to it. Its queue comes from its KV
    being full or from how much prefill it takes in per step, and says nothing about how many
    turns it can run. It is capped only while it runs the most it can at once (`max_running`,
    when known), or our turns there reach that number, and then at that number; otherwise it
    stays open. The KV rule (`residency`) is what keeps its working set in its pool.

    Any other engine is uncapped while it reports no queue (or no load at all). Once it queues,
    the cap is what it runs, and it stays until the engine idles:
    - a queue seen on two probes in a row lowers it by that queue, less our turns beyond the
      cap (never below what the engine runs); a queue on one probe alone is a turn caught
      between its arrival and the engine's next step, and lowering the cap for it would
      ratchet the cap down to whatever happened to be running;
    - a probe that finds no queue while our turns fill the cap raises it by one.
    Without the hysteresis a capped engine shows an empty queue (the cap keeps it empty), the
    cap lifts, every held turn floods the engine at once, and a continuation waits behind all
    of them until the next probe.
    """
    cap = replica.cap
    if waiting is None:
        return None
    if replica.kv_tokens is not None:
        most = replica.max_running
        full = most is not None and ((running or 0) >= most or replica.in_flight >= most)
        return most if full else None
    if cap is None:
        return max(running or 0, 1) if waiting > 0 else None
    if waiting > 0:
        if not replica.engine_waiting:
            return cap
        # Our own turns beyond the cap (interactive ones a preemptive engine made room for)
        # are expected to queue: only a queue longer than that says the cap is too high.
        queue = max(waiting - max(replica.in_flight - cap, 0), 0)
        return max(running or 0, 1, cap - min(queue, replica.engine_waiting))
    if not running:
        return None
    return cap + 1 if replica.in_flight >= cap else cap


def limit_of(cap: int | None, slots: int, unread: bool = False) -> int | None:
    """A replica's turn limit from its engine-load cap and its engine slots (0: none); one
    while it is `unread` (see `Replica.unread`)."""
    if unread:
        return 1
    if not slots:
        return cap
    return slots if cap is None else min(cap, slots)


def _check_id(name: str, value: str) -> None:
    if not value:
        raise ValueError(f"{name} must not be empty")


# --- state ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Replica:
    """One endpoint of the pool as the scheduler sees it."""

    id: str
    url: str
    models: frozenset[str]
    kind: EndpointKind = EndpointKind.GENERATIVE
    # Its position in the pool's configuration: its bit in the room sets (`room`).
    index: int = 0
    healthy: bool = False
    # What the engine last reported on /metrics; None when it reports nothing.
    engine_running: int | None = None
    engine_waiting: int | None = None
    # Derived (`counters`): turns placed here and not yet finished, of those the interactive
    # ones (a preemptive engine takes them beyond the cap), and the interactive runs paused on
    # a tool here (batch leaves one slot for each).
    in_flight: int = 0
    interactive_in_flight: int = 0
    paused_interactive: int = 0
    # Derived (`counters`): the prompt tokens its turns in flight are expected to compute and
    # have not shown a first token for yet (`Turn.prefill_tokens`): the reading queued there.
    pending_prefill: int = 0
    # Turn cap from the engine's load: see `next_cap`.
    cap: int | None = None
    # The `priority` its engine gets per class (endpoint `priority`); None sends none.
    priority: Priorities | None = None
    # Engine slots the core assigns (endpoint `slots`; 0: the engine picks): per slot the run
    # whose context it holds ("" none), and (derived, `counters`) the slots with a turn in
    # flight. See `slots`.
    slots: int = 0
    slot_runs: tuple[str, ...] = ()
    busy_slots: frozenset[int] = frozenset()
    # Per save file of its engine (endpoint `slot_saves`) the run whose context it holds ("").
    saves: tuple[str, ...] = ()
    # Turns it takes at once: the cap, and never more than its slots (`limit_of`); a field,
    # not a property, because the placement rules read it several times per event.
    capacity: int | None = None
    # Its engine's KV pool in tokens (endpoint `kv_tokens`, else the engine's metrics; None when
    # unknown) and the tokens its batch held at the last probe.
    kv_tokens: int | None = None
    kv_used: int | None = None
    # The endpoint file's `kv_tokens` (0: take the engine's figure).
    kv_config: int = 0
    # The most requests its engine runs at once (endpoint `max_running`, else the engine's
    # /server_info; None when unknown).
    max_running: int | None = None
    # Its engine last queued with its KV full: its queue sets no turn cap (see `next_cap`).
    kv_bound: bool = False
    # Derived (`residency`): Σ of the footprints of the runs resident here, and whether a new
    # run of each class fits beside them (from it, the pool and the learned size of a new run).
    resident_tokens: int = 0
    new_batch_fits: bool = True
    new_interactive_fits: bool = True
    # Derived (`residency.spills`, set as each turn here ends): whether a new run
    # may start past the KV rule's margin while nothing here waits to be read, because reading
    # the margin's worth of contexts again takes this replica less time than a paused run is
    # away (True until both are known).
    spills: bool = True
    # Time to first token against uncached prompt tokens: what reading context costs here.
    prefill: PrefillFit = _NO_FIT
    # The least time to first token per uncached prompt token any turn here took: what reading
    # costs the engine itself (a queue only adds to it; `residency.spills`). None before one.
    read_s_per_token: float | None = None
    # Rate-limited (a hosted API with a window, see `gate`): its turns are admitted by its
    # budget, never placed by a dataplane on its own.
    limited: bool = False
    # Not known yet to have no rate limit (the endpoint file gives no `limits`): it takes one
    # turn at a time (`capacity` 1), so a hosted API's first burst is not refused before its
    # first reply's headers say what it allows. A reply without rate-limit headers, or a probe
    # that reads its engine's load (an engine of our own), ends it (`upkeep.read`); a reply
    # with them makes it rate-limited (`gate.observe`).
    unread: bool = False

    def __post_init__(self) -> None:
        _check_id("replica id", self.id)
        if not 0 <= self.interactive_in_flight <= self.in_flight or self.paused_interactive < 0:
            raise ValueError(f"replica {self.id}: negative counts")
        if self.pending_prefill < 0:
            raise ValueError(f"replica {self.id}: negative pending prefill")
        if len(self.slot_runs) != self.slots:
            raise ValueError(f"replica {self.id}: slot_runs must have one entry per slot")
        if self.saves and not self.slots:
            raise ValueError(f"replica {self.id}: saves need slots")
        if self.capacity != limit_of(self.cap, self.slots, self.unread):
            raise ValueError(f"replica {self.id}: capacity must follow cap and slots")
        if self.resident_tokens < 0 or (self.kv_tokens is not None and self.kv_tokens < 1):
            raise ValueError(f"replica {self.id}: negative KV figures")

    def new_fits(self, service_class: ServiceClass) -> bool:
        """Whether the KV rule lets a new run of `service_class` start here now: its working
        set leaves room for one; or nothing placed here waits to be read (`pending_prefill`),
        so the engine would start it at once, and this engine reads the contexts it pushes out
        again faster than their runs come back (`spills`)."""
        if not self.pending_prefill and self.spills:
            return True
        if service_class is ServiceClass.BATCH:
            return self.new_batch_fits
        return self.new_interactive_fits

    @property
    def preemptive(self) -> bool:
        """Its engine preempts a running batch turn for a waiting interactive one."""
        return self.priority is not None and self.priority.preemptive

    def engine_priority(self, service_class: ServiceClass) -> int | None:
        """The `priority` a turn of `service_class` carries to this replica's engine."""
        if self.priority is None:
            return None
        if service_class is ServiceClass.BATCH:
            return self.priority.batch
        return self.priority.interactive


@dataclass(frozen=True, kw_only=True)
class Run:
    """An agent run: the replica that holds its prefix and what it is doing."""

    id: str
    replica: str = ""
    phase: Phase = Phase.IDLE
    service_class: ServiceClass = ServiceClass.INTERACTIVE
    caller: str = ""
    # Derived (`counters`): its turns in flight.
    turns_in_flight: int = 0
    last_active: float = 0.0
    # The run was ended while a turn was in flight: forget it when that turn ends.
    ended: bool = False
    # The dataplane that placed or reported its last turn ("" when unknown).
    dataplane: str = ""
    # Derived (`expiry`): the second at which its idle expiry is next checked; -1 for none.
    check_at: int = -1
    # Its context after its last finished turn (prompt + completion tokens; 0 before one), the
    # part of it its first turn found cached (a preamble other runs share), and the turns it
    # finished.
    context_tokens: int = 0
    shared_tokens: int = 0
    rounds: int = 0
    # The tokens it counts in its replica's `resident_tokens`; 0 when it is not resident there.
    footprint: int = 0
    # Until when an idle or paused run stays resident (expected back); see `residency`.
    resident_until: float = 0.0
    # A turn of it arrived since its last turn ended (learned as a comeback then).
    back: bool = False

    def __post_init__(self) -> None:
        _check_id("run id", self.id)
        if self.turns_in_flight < 0:
            raise ValueError(f"run {self.id}: negative turns in flight")
        if min(self.context_tokens, self.shared_tokens, self.footprint, self.rounds) < 0:
            raise ValueError(f"run {self.id}: negative token counts")

    @property
    def pinned(self) -> bool:
        """Generating or paused on a tool: its next turn must go to its replica."""
        return bool(self.replica) and self.phase is not Phase.IDLE

    @property
    def resident(self) -> bool:
        """Counted in its replica's working set: its next turn waits for that replica."""
        return self.footprint > 0


@dataclass(frozen=True, kw_only=True)
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
    # Position in placement order (the turn-timeout index).
    order: int = 0
    # The engine slot it runs in (replica `slots`); -1 when the engine picked.
    slot: int = -1
    # Save files (replica `saves`): the one the slot's content is saved to before the turn, and
    # the one its run's context is restored from; -1 for none.
    save_to: int = -1
    restore_from: int = -1
    # The request body's size (for the learned bytes per prompt token), and when its engine
    # request started (TurnStarted; -1 before).
    prompt_bytes: int = 0
    started_at: float = -1.0
    first_token_at: float = -1.0
    # The rate-limit windows holding a reservation for it (see `gate`), and its request's
    # max_tokens (0: none).
    windows: tuple[str, ...] = ()
    max_tokens: int = 0
    # The prompt tokens it was expected to compute there when placed (`placement.prefill`).
    prefill_tokens: int = 0

    def __post_init__(self) -> None:
        _check_id("turn id", self.id)
        _check_id("turn replica", self.replica)


@dataclass(frozen=True, kw_only=True)
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
    bucket: Bucket = ("m", "", "")
    prompt_bytes: int = 0
    # Held by the KV rule past NEW_RUN_MAX_HOLD_S: it goes to any replica with room.
    overdue: bool = False
    # Its request's opening keys (`common.prefixes`): a new run goes where they were served.
    opening: tuple[Key, ...] = ()
    # Its request's max_tokens (0: none), the caller key's budget it is admitted against, and
    # the wall clock (Unix seconds) when it arrived, for a key's daily quota.
    max_tokens: int = 0
    key: KeyLimits | None = None
    wall_at: float = 0.0

    def __post_init__(self) -> None:
        _check_id("turn id", self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyLimits:
    """A caller key's own budget (the keys file); 0 is no limit of that kind."""

    name: str
    tokens_per_minute: int = 0
    requests_per_minute: int = 0
    daily_tokens: int = 0

    @property
    def limited(self) -> bool:
        return bool(self.tokens_per_minute or self.requests_per_minute or self.daily_tokens)

    def per_minute(self) -> dict[str, int]:
        return {"tokens": self.tokens_per_minute, "requests": self.requests_per_minute}


@dataclass(frozen=True, kw_only=True)
class DataplaneLink:
    """How many event streams a dataplane has open, and since when it has had none."""

    streams: int = 0
    gone_since: float | None = None


@dataclass(frozen=True, kw_only=True)
class ClassShare:
    """One model's pool as the `share` rule sees it (`shares`): the turn-seconds each class had
    in flight there, fading with SHARE_TAU_S, as of `at`; and (derived) each class's turns in
    flight and held there now."""

    at: float = 0.0
    interactive_s: float = 0.0
    batch_s: float = 0.0
    # Derived (`shares`): counted from the turns in flight and the held turns.
    interactive_in_flight: int = 0
    batch_in_flight: int = 0
    interactive_held: int = 0
    batch_held: int = 0
