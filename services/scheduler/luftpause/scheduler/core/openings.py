"""The openings each replica served lately: where a new run's prefix may be cached.

Pure module: frozen values, functions that return new ones. Per replica, the opening keys
(`common.prefixes.opening_keys`) of the turns placed there, each with the tick it was last
used; at most INDEX_SIZE keys per replica, the least recently used dropped first. An entry says
the engine served that opening, not that it still holds it (the engine evicts as it likes); the
bound keeps the index to what was served lately. These are facts learned from placements, not
derived from runs, so a Resync keeps them.

The order of use is a counter-keyed map read from its oldest end, as the turn-timeout index is:
a key used again leaves a gap that the head skips once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import immutables

from luftpause.common.prefixes import Key

INDEX_SIZE = 512
"""Opening keys remembered per replica."""

_EMPTY: immutables.Map[int, int] = immutables.Map()


@dataclass(frozen=True, slots=True, kw_only=True)
class OpeningIndex:
    """One replica's opening keys: key -> tick of last use, and tick -> key."""

    keys: immutables.Map[int, int] = _EMPTY
    order: immutables.Map[int, int] = _EMPTY
    head: int = 0
    tail: int = 0


def record(index: OpeningIndex, opening: Iterable[Key]) -> OpeningIndex:
    """`index` once the replica served a turn with this opening."""
    keys, order, head, tail = index.keys, index.order, index.head, index.tail
    for key, _ in opening:
        old = keys.get(key)
        if old is not None:
            order = order.delete(old)
        keys = keys.set(key, tail)
        order = order.set(tail, key)
        tail += 1
    while len(keys) > INDEX_SIZE:
        oldest = order.get(head)
        if oldest is not None:
            keys = keys.delete(oldest)
            order = order.delete(head)
        head += 1
    return OpeningIndex(keys=keys, order=order, head=head, tail=tail)
