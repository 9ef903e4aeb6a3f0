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
for "m", "o" and "s", are one tuple under the model, with a seventh mask, the healthy generative
replicas serving it (`healthy_count`): a replica gaining or losing room changes one map entry per
model it serves, not one set per flag. A model whose masks are all empty has no entry.

An *open* replica (`is_open`) has room for every turn: a dataplane may place turns there itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import immutables

from luftpause.common.config import EndpointKind
from luftpause.scheduler.core.model import Replica, ServiceClass

RoomKey = tuple[str, str, ServiceClass]
Flags = tuple[bool, bool, bool, bool]
Masks = tuple[int, ...]  # (kind, class) by `_SLOT`, then the healthy generative replicas
Room = immutables.Map[str, Masks]

_I, _B = ServiceClass.INTERACTIVE, ServiceClass.BATCH
_NONE: Flags = (False, False, False, False)
_NO_MASKS: Masks = (0, 0, 0, 0, 0, 0, 0)
_HEALTHY = 6
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
    if not replica.pending_prefill and replica.spills:  # `Replica.new_fits` of both classes
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


def healthy_count(room: Room, model: str) -> int:
    """How many generative replicas serving `model` are healthy."""
    masks = room.get(model)
    return 0 if masks is None else masks[_HEALTHY].bit_count()


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
    health = new.healthy if new.healthy != old.healthy else None
    if before == after and health is None:
        return room, False
    bit, keep = 1 << new.index, ~(1 << new.index)
    single = new.kind is EndpointKind.SINGLE_PASS
    f0, f1, f2, f3 = after
    for model in new.models:
        m = room.get(model, _NO_MASKS)
        if single:
            masks = (
                *m[:4],
                m[4] | bit if f0 else m[4] & keep,
                m[5] | bit if f1 else m[5] & keep,
                m[6],
            )
        else:
            masks = (
                m[0] | bit if f0 else m[0] & keep,
                m[1] | bit if f1 else m[1] & keep,
                m[2] | bit if f2 else m[2] & keep,
                m[3] | bit if f3 else m[3] & keep,
                m[4],
                m[5],
                m[6] if health is None else m[6] | bit if health else m[6] & keep,
            )
        if any(masks):
            room = room.set(model, masks)
        elif model in room:
            room = room.delete(model)
    return room, (f0 > before[0]) or (f1 > before[1]) or (f2 > before[2]) or (f3 > before[3])


def build(replicas: Iterable[Replica]) -> Room:
    """The room sets of `replicas`, from them alone."""
    room: dict[str, list[int]] = {}
    for replica in replicas:
        single = replica.kind is EndpointKind.SINGLE_PASS
        slots = _SINGLE_SLOTS if single else _GENERATIVE_SLOTS
        bit = 1 << replica.index
        for model in replica.models:
            masks = room.setdefault(model, [0] * len(_NO_MASKS))
            for slot, fits in zip(slots, flags(replica), strict=True):
                if fits and slot >= 0:
                    masks[slot] |= bit
            if replica.healthy and not single:
                masks[_HEALTHY] |= bit
    return immutables.Map({m: tuple(masks) for m, masks in room.items() if any(masks)})
