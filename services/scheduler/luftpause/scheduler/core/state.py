"""The decision core's state: `State`, immutable, and `Draft`, the one mutable copy of it.

Pure module: values only. `decide()` makes a `Draft` of the state it is given, the core's steps
change the draft, and `Draft.freeze()` makes the next `State`; nothing else ever changes state,
and the type checker holds everyone else to that (`State` is a frozen dataclass). The
maps are persistent (`immutables.Map`, a HAMT): an update copies O(log n) nodes, so a step costs
what it changes, and the previous state stays whole for whoever holds it.

Facts and indexes. The facts are what the scheduler was told or decided: the replicas (their
configuration, health, what their engines report, their slot and save tables, what was learned
about their prefill), the runs, the turns in flight, the held turns, the dataplanes' links, the
learned sizes, comebacks and openings. Everything else is an index, derived from the facts and
kept in step with them by exactly one module, which owns both the step-by-step update and a
`rebuild` from the facts alone (Resync rebuilds; the property tests check after every step that
each index equals its rebuild):

- `counters`: per replica, the turns in flight (all, interactive), the busy slots and the
  interactive runs paused on a tool there; per caller and per run, the turns in flight;
- `queues`: the held-turn queues, their heads, the held turns by run; a time no turn held as
  a new run arrived before (a bound);
- `expiry`: the turn-timeout order, the runs' idle-expiry checks;
- `residency`: per replica, the resident tokens and new-run flags; the residency checks; the
  count of idle resident runs (`Draft.change_run` keeps it);
- `room` (`placement` stores replicas, `Draft.settle` brings the sets up to date): the replicas
  with room per (kind, model, class); the open-replica version;
- `shares`: per model, each class's turns in flight and held (beside the turn-seconds each had
  lately, a fact the same module keeps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

import immutables

from luftpause.scheduler.core import room as rooms
from luftpause.scheduler.core.learned import Comeback, ComebackKey, Replies, Sizes
from luftpause.scheduler.core.model import (
    DATAPLANE_GRACE_S,
    Bucket,
    Chain,
    ClassShare,
    DataplaneLink,
    HeldTurn,
    Phase,
    Replica,
    Rules,
    Run,
    ServiceClass,
    Turn,
    evolve,
)
from luftpause.scheduler.core.openings import OpeningIndex
from luftpause.scheduler.core.windows import Window

_EMPTY: immutables.Map[Any, Any] = immutables.Map()
_NO_SIZES = Sizes()
_RULES = Rules()
_T = TypeVar("_T")

RoomKey = rooms.RoomKey
QueueKey = tuple[Bucket, ServiceClass, str]
HeadKey = tuple[Bucket, ServiceClass]


@dataclass(frozen=True, kw_only=True)
class State:
    """Everything the scheduler knows, as of one event. Never changed: see `Draft`."""

    # --- facts ---
    replicas: immutables.Map[str, Replica] = _EMPTY
    # The replica ids by `Replica.index`, and model -> replica ids serving it (generative and
    # single-pass apart), fixed by config.
    replica_ids: tuple[str, ...] = ()
    generative_by_model: immutables.Map[str, tuple[str, ...]] = _EMPTY
    single_pass_by_model: immutables.Map[str, tuple[str, ...]] = _EMPTY
    runs: immutables.Map[str, Run] = _EMPTY
    turns: immutables.Map[str, Turn] = _EMPTY
    held: immutables.Map[str, HeldTurn] = _EMPTY
    next_seq: int = 0
    dataplanes: immutables.Map[str, DataplaneLink] = _EMPTY
    dataplane_grace_s: float = DATAPLANE_GRACE_S
    # The placement rules in force (all but `headroom` by default; see `model.Rules`).
    rules: Rules = _RULES
    # Learned from reported turns (see `learned`): token sizes over the pool, and per (class,
    # ended with tool calls, rounds finished or -1 for any) how runs come back.
    sizes: Sizes = _NO_SIZES
    comebacks: immutables.Map[ComebackKey, Comeback] = _EMPTY
    # Per replica, the openings it served lately (see `openings`).
    openings: immutables.Map[str, OpeningIndex] = _EMPTY
    # Rate limits (see `gate`): the windows by id (endpoints' and keys'), the window of each
    # limited replica, the turns held for a window, and the replies learned per (model, caller).
    windows: immutables.Map[str, Window] = _EMPTY
    window_of: immutables.Map[str, str] = _EMPTY
    budget_held: immutables.Map[str, HeldTurn] = _EMPTY
    replies: immutables.Map[tuple[str, str], Replies] = _EMPTY
    # When a turn held for a window fits by refill alone (-1: none): the shell ticks then.
    wake_at: float = -1.0
    # Per model, how its pool's time split between the classes lately (`shares`).
    shares: immutables.Map[str, ClassShare] = _EMPTY
    # --- indexes (see the table above for their owners) ---
    caller_in_flight: immutables.Map[str, int] = _EMPTY
    # (bucket, class, caller) -> FIFO (front chain, reversed back chain) of (seq, turn id);
    # (bucket, class) -> caller -> (seq, id) of its queue's head; run -> its held turn ids.
    queues: immutables.Map[QueueKey, tuple[Chain, Chain]] = _EMPTY
    heads: immutables.Map[HeadKey, immutables.Map[str, tuple[int, str]]] = _EMPTY
    held_by_run: immutables.Map[str, tuple[str, ...]] = _EMPTY
    # Placement order -> turn id, from head (oldest) to tail; second -> chain of runs to check.
    turn_order: immutables.Map[int, str] = _EMPTY
    turn_order_head: int = 0
    turn_order_tail: int = 0
    run_checks: immutables.Map[int, Chain] = _EMPTY
    run_check_cursor: int = -1
    # Step of RESIDENCY_STEP_S -> chain of runs whose residency may end then.
    residency_checks: immutables.Map[int, Chain] = _EMPTY
    residency_cursor: int = -1
    # How many runs are idle and resident (`residency`): the runs whose held turns wait for their
    # replica a bounded time (`holds`); with none, the tick has no soft wait to look at.
    idle_resident: int = 0
    # No turn held in an "m" bucket arrived before this (a bound, lowered as turns are queued
    # there, made exact when the tick looks at them; `queues`): none waited NEW_RUN_MAX_HOLD_S
    # while the clock is less than that past it.
    new_held_since: float = math.inf
    # model -> the masks of the healthy replicas serving it with room for each class (`room`):
    # kind "m" where a new run may start too (the KV rule), "o" any, "s" single-pass.
    room: rooms.Room = _EMPTY
    # Bumped whenever the set of open replicas (`room.is_open`) may have changed; the shell
    # publishes the new set to the dataplanes when it sees a new value.
    open_version: int = 0

    def room_for(self, key: RoomKey) -> int:
        """The room set `key`, (kind, model, class), as a mask of replica positions."""
        return rooms.lookup(self.room, key)

    def room_ids(self, mask: int) -> list[str]:
        """The ids of the replicas in `mask`, by position."""
        return rooms.ids(self.replica_ids, mask)

    def healthy_count(self, model: str) -> int:
        """How many generative replicas serving `model` are healthy."""
        return rooms.healthy_count(self.room, model)


class Draft:
    """The state one `decide()` call works on: the same fields as `State`, each settable.

    Made only by `decide()` (`Draft(state)`), frozen into the next `State` at its end. Besides
    the state's fields it collects `opened`: the replicas whose room for new runs opened during
    the call, whose held turns the call drains before it returns; and `stale`: the replicas
    stored since the room sets were last brought up to date, each as the room sets last saw
    it (`settle`, which every read of the room sets and `freeze` do first); and `mine`: the
    records this call made (`adopt`), which no state holds yet, so the call changes them in
    place rather than copying them again (`change_run`, the shares; a replica stored since
    the room sets last looked is the call's own copy too, `placement.update_replica`): a step
    copies each run, replica and share it changes once, however many of its parts change it.
    State and draft keep their fields in an instance `__dict__`, so making a draft and
    freezing it are one dict copy each (a decision is a few dozen microseconds; copying 26
    slots one by one was a tenth of it).
    """

    # The fields of `State`, as documented there.
    replicas: immutables.Map[str, Replica]
    replica_ids: tuple[str, ...]
    generative_by_model: immutables.Map[str, tuple[str, ...]]
    single_pass_by_model: immutables.Map[str, tuple[str, ...]]
    runs: immutables.Map[str, Run]
    turns: immutables.Map[str, Turn]
    held: immutables.Map[str, HeldTurn]
    next_seq: int
    dataplanes: immutables.Map[str, DataplaneLink]
    dataplane_grace_s: float
    rules: Rules
    sizes: Sizes
    comebacks: immutables.Map[ComebackKey, Comeback]
    openings: immutables.Map[str, OpeningIndex]
    windows: immutables.Map[str, Window]
    window_of: immutables.Map[str, str]
    budget_held: immutables.Map[str, HeldTurn]
    replies: immutables.Map[tuple[str, str], Replies]
    wake_at: float
    shares: immutables.Map[str, ClassShare]
    caller_in_flight: immutables.Map[str, int]
    queues: immutables.Map[QueueKey, tuple[Chain, Chain]]
    heads: immutables.Map[HeadKey, immutables.Map[str, tuple[int, str]]]
    held_by_run: immutables.Map[str, tuple[str, ...]]
    turn_order: immutables.Map[int, str]
    turn_order_head: int
    turn_order_tail: int
    run_checks: immutables.Map[int, Chain]
    run_check_cursor: int
    residency_checks: immutables.Map[int, Chain]
    residency_cursor: int
    idle_resident: int
    new_held_since: float
    room: rooms.Room
    open_version: int
    opened: list[str]
    stale: dict[str, Replica]
    mine: dict[int, object]

    def __init__(self, s: State) -> None:
        fields = s.__dict__.copy()  # one table copy (see `model.evolve`)
        fields["opened"] = []
        fields["stale"] = {}
        fields["mine"] = {}
        self.__dict__ = fields

    def owns(self, record: object) -> bool:
        """Whether `record` was made by this draft (`adopt`): no state holds it, so the draft
        may change it in place instead of copying it again."""
        return self.mine.get(id(record)) is record

    def adopt(self, record: _T) -> _T:
        """Note `record` as made by this draft, to be changed in place from now on (it must be
        new: no state, and no other record, holds it); returned as it is."""
        self.mine[id(record)] = record
        return record

    def change_run(self, run: Run, **changes: Any) -> Run:
        """Store `run` with `changes` and return it as stored: changed in place when it is the
        run stored and this draft made it, else copied once (and the copy adopted), so a step
        copies each run it changes once however often it changes it. The caller must not read
        `run` afterwards expecting the old values: it may be the same record. Keeps the count
        of idle resident runs (`idle_resident`, whose owner is `residency`)."""
        stored = self.runs.get(run.id)
        was = stored is not None and stored.footprint > 0 and stored.phase is Phase.IDLE
        if stored is run and self.mine.get(id(run)) is run:
            run.__dict__.update(changes)
            new = run
        else:
            new = evolve(run, **changes)
            self.mine[id(new)] = new
            self.runs = self.runs.set(run.id, new)
        now = new.footprint > 0 and new.phase is Phase.IDLE
        if now != was:
            self.idle_resident += 1 if now else -1
        return new

    def room_for(self, key: RoomKey) -> int:
        """The room set `key`, (kind, model, class), as a mask of replica positions."""
        if self.stale:
            self.settle()
        return rooms.lookup(self.room, key)

    def room_ids(self, mask: int) -> list[str]:
        """The ids of the replicas in `mask`, by position."""
        return rooms.ids(self.replica_ids, mask)

    def healthy_count(self, model: str) -> int:
        """How many generative replicas serving `model` are healthy."""
        if self.stale:
            self.settle()
        return rooms.healthy_count(self.room, model)

    def settle(self) -> None:
        """Bring the room sets and the open version up to date with the replicas stored since
        they last were, once per replica: a replica that gained room goes to `opened`."""
        room = self.room
        replicas = self.replicas
        for rid, old in self.stale.items():
            new = replicas[rid]
            if new is old:
                continue
            room, gained = rooms.moved(room, old, new)
            if gained:
                self.opened.append(rid)
            if rooms.is_open(new) != rooms.is_open(old):
                self.open_version += 1
        self.room = room
        self.stale.clear()

    def freeze(self) -> State:
        """The state this draft now describes. Its records are the state's from now on: the
        draft copies any it changes after this."""
        if self.stale:
            self.settle()
        state = object.__new__(State)
        fields = self.__dict__.copy()
        del fields["opened"]
        del fields["stale"]
        del fields["mine"]
        object.__setattr__(state, "__dict__", fields)
        self.mine = {}
        return state


View = State | Draft
"""What the core's queries read: a state, or the draft a step is making."""
