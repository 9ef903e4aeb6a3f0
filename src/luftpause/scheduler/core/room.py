"""The room index: which replicas have room for one more turn, per (kind, model, class).

Pure module: functions of replicas, no I/O. Room sets, per (kind, model, class), hold the
healthy replicas serving the model with room for a turn of the class: "m" those where a new run
may also start (the KV rule, see `residency`), "o" all of them (turns the KV rule has held long
enough), "s" single-pass. `placement` reads them to find where a turn may go without looking at
every replica; `Draft.settle` keeps them in step with the replicas a step changed, once per
changed replica however often the step changed it (a freed slot and the held turn that takes it
change a replica several times); `build` makes them from the replicas alone.

A set is a bit mask over the replicas' positions in the configuration (`Replica.index`;
`State.replica_ids` maps a position back to its id), and the six sets of a model, (kind, class)
for "m", "o" and "s", are one tuple under the model: a replica gaining or losing room changes
one map entry per model it serves, not one set per flag. A model whose sets are all empty has
no entry.

An *open* replica (`is_open`) has room for every turn: a dataplane may place turns there itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import immutables

from luftpause.common.config import EndpointKind
from luftpause.scheduler.core.model import Replica, ServiceClass

RoomKey = tuple[str, str, ServiceClass]
Flags = tuple[bool, bool, bool, bool]
Masks = tuple[int, ...]  # six: (kind, class) by `_SLOT`
Room = immutables.Map[str, Masks]

_I, _B = ServiceClass.INTERACTIVE, ServiceClass.BATCH
_NONE: Flags = (False, False, False, False)
_NO_MASKS: Masks = (0, 0, 0, 0, 0, 0)
# Where each (kind, class) sits in a model's masks, and where each flag of `flags` goes (-1:
# a flag the kind does not have).
_SLOT = {("m", _I): 0, ("m", _B): 1, ("o", _I): 2, ("o", _B): 3, ("s", _I): 4, ("s", _B): 5}
_GENERATIVE_SLOTS = (0, 1, 2, 3)
_SINGLE_SLOTS = (4, 5, -1, -1)


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
    """Whether `replica` counts in each room set of its kind: "m" interactive, "m" batch, "o"
    interactive, "o" batch for a generative one; "s" interactive, "s" batch for a single-pass
    one (and two unused flags)."""
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


def lookup(room: Room, key: RoomKey) -> int:
    """The mask of the room set `key`: (kind, model, class)."""
    kind, model, cls = key
    masks = room.get(model)
    return 0 if masks is None else masks[_SLOT[kind, cls]]


def ids(replica_ids: tuple[str, ...], mask: int) -> list[str]:
    """The ids of the replicas in `mask`, by position."""
    out: list[str] = []
    while mask:
        low = mask & -mask
        out.append(replica_ids[low.bit_length() - 1])
        mask ^= low
    return out


def moved(room: Room, old: Replica, new: Replica) -> tuple[Room, bool]:
    """`room` with replica `new` counted where `old` was; whether it gained room anywhere."""
    before, after = flags(old), flags(new)
    if before == after:
        return room, False
    bit = 1 << new.index
    slots = _SINGLE_SLOTS if new.kind is EndpointKind.SINGLE_PASS else _GENERATIVE_SLOTS
    for model in new.models:
        masks = list(room.get(model, _NO_MASKS))
        for slot, was, now in zip(slots, before, after, strict=True):
            if was != now and slot >= 0:
                masks[slot] = masks[slot] | bit if now else masks[slot] & ~bit
        if any(masks):
            room = room.set(model, tuple(masks))
        elif model in room:
            room = room.delete(model)
    return room, any(now and not was for was, now in zip(before, after, strict=True))


def build(replicas: Iterable[Replica]) -> Room:
    """The room sets of `replicas`, from them alone."""
    room: dict[str, list[int]] = {}
    for replica in replicas:
        slots = _SINGLE_SLOTS if replica.kind is EndpointKind.SINGLE_PASS else _GENERATIVE_SLOTS
        for slot, fits in zip(slots, flags(replica), strict=True):
            if fits and slot >= 0:
                for model in replica.models:
                    room.setdefault(model, [0] * 6)[slot] |= 1 << replica.index
    return immutables.Map({m: tuple(masks) for m, masks in room.items() if any(masks)})
