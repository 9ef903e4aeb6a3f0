"""The room index: which replicas have room for one more turn, per (kind, model, class).

Pure module: functions of replicas, no I/O. Room sets, per (kind, model, class), hold the
healthy replicas serving the model with room for a turn of the class: "m" those where a new run
may also start (the KV rule, see `residency`), "o" all of them (turns the KV rule has held long
enough), "s" single-pass. `placement` reads them to find where a turn may go without looking at
every replica; `Draft.settle` keeps them in step with the replicas a step changed, once per
changed replica however often the step changed it (a freed slot and the held turn that takes it
change a replica several times); `build` makes them from the replicas alone.

An *open* replica (`is_open`) has room for every turn: a dataplane may place turns there itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import immutables

from luftpause.common.config import EndpointKind
from luftpause.scheduler.core.model import Replica, ServiceClass

RoomKey = tuple[str, str, ServiceClass]
Flags = tuple[bool, bool, bool, bool]

_CLASSES = (ServiceClass.INTERACTIVE, ServiceClass.BATCH)
_NO_IDS: frozenset[str] = frozenset()
_NONE: Flags = (False, False, False, False)
_SINGLE_KEYS = (("s", _CLASSES[0]), ("s", _CLASSES[1]), ("", _CLASSES[0]), ("", _CLASSES[1]))
_GENERATIVE_KEYS = (("m", _CLASSES[0]), ("m", _CLASSES[1]), ("o", _CLASSES[0]), ("o", _CLASSES[1]))


def room_pair(replica: Replica) -> tuple[bool, bool]:
    """Whether `replica` can take one more (interactive, batch) turn now, health aside."""
    cap = replica.capacity
    if cap is None:
        return True, True
    free = cap - replica.in_flight
    if replica.priority is not None and replica.priority.preemptive:
        return replica.interactive_in_flight < cap, free > 0
    return free > 0, free > replica.paused_interactive


def is_open(replica: Replica) -> bool:
    """Every turn fits on `replica` now: a dataplane may place turns there itself."""
    return (
        replica.healthy
        and replica.capacity is None
        and replica.kind is EndpointKind.GENERATIVE
        and not replica.limited
        and replica.new_batch_fits
        and replica.new_interactive_fits
    )


def flags(replica: Replica) -> Flags:
    """Whether `replica` counts in each room set of its kind: see `keys`."""
    if not replica.healthy:
        return _NONE
    interactive, batch = room_pair(replica)
    if replica.kind is EndpointKind.SINGLE_PASS:
        return (interactive, batch, False, False)
    if not replica.pending_prefill:  # `Replica.new_fits` of both classes
        return (interactive, batch, interactive, batch)
    return (
        interactive and replica.new_interactive_fits,
        batch and replica.new_batch_fits,
        interactive,
        batch,
    )


def keys(replica: Replica) -> tuple[tuple[str, ServiceClass], ...]:
    """The (kind, class) of each flag `flags` returns ("" where the kind has none)."""
    return _SINGLE_KEYS if replica.kind is EndpointKind.SINGLE_PASS else _GENERATIVE_KEYS


def moved(
    room: immutables.Map[RoomKey, frozenset[str]], old: Replica, new: Replica
) -> tuple[immutables.Map[RoomKey, frozenset[str]], bool]:
    """`room` with replica `new` counted where `old` was; whether it gained room anywhere."""
    before, after = flags(old), flags(new)
    if before == after:
        return room, False
    rid = new.id
    for (kind, cls), was, now in zip(keys(new), before, after, strict=True):
        if was != now and kind:
            for model in new.models:
                key = (kind, model, cls)
                ids = room.get(key, _NO_IDS)
                room = room.set(key, ids | {rid} if now else ids - {rid})
    return room, any(now and not was for was, now in zip(before, after, strict=True))


def build(replicas: Iterable[Replica]) -> immutables.Map[RoomKey, frozenset[str]]:
    """The room sets of `replicas`, from them alone."""
    room: dict[RoomKey, set[str]] = {}
    for replica in replicas:
        for (kind, cls), fits in zip(keys(replica), flags(replica), strict=True):
            if fits and kind:
                for model in replica.models:
                    room.setdefault((kind, model, cls), set()).add(replica.id)
    return immutables.Map({key: frozenset(ids) for key, ids in room.items()})
