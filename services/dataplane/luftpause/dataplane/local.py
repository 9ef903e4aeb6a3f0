"""Placing a turn on an open replica without asking the scheduler: the rule and its inputs.

Pure module: no I/O. The scheduler tells each dataplane which replicas are *open*: healthy,
generative, and their engine reports no waiting queue, so every turn fits there and the
scheduler's own rule comes down to affinity, then load. The dataplane applies that rule itself
to the runs whose history it holds, and reports the placement on its Report stream; every other
turn waits for the scheduler as before:

- a run this dataplane started with this turn (no run id from the client, no echoed tool call
  it knows): of the open replicas serving the model, the one where it costs the engines least
  to read, as the scheduler picks (`scheduler.core.cost`), counted in request bytes here: the
  bytes of this dataplane's turns there whose first token has not come yet, plus the turn's own
  less the opening (tools and first messages) this dataplane sent there lately; then the fewest
  of its turns in flight, then by id;
- a run in this dataplane's run table: its last replica, if that replica is open and serves the
  model (the scheduler sends a pinned run there, and an idle one while it has room); otherwise
  the scheduler decides (the run may have to wait, or move);
- any other run (a client-chosen id this dataplane has not served): the scheduler decides,
  since another dataplane may hold it.

A run whose turn then comes through another dataplane is named to this one (`taken_runs` on
the Report stream), which drops it from its run table, so its next turn here is asked for.
What the rule cannot see is a turn that crosses that notice: if this dataplane places a run it
still believes its own while another dataplane's turn of it is being placed, the scheduler
records whichever placement comes last, as a move.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from luftpause.common.prefixes import Key
from luftpause.dataplane.identity import ServiceClass
from luftpause.dataplane.runs import RunRecord

OPENINGS_PER_REPLICA = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenReplica:
    """A replica any turn fits on now, as the scheduler last said."""

    replica_id: str
    url: str
    models: frozenset[str]
    interactive_priority: int | None = None
    batch_priority: int | None = None

    def engine_priority(self, service_class: ServiceClass) -> int | None:
        """The `priority` a turn of `service_class` carries to this replica's engine."""
        if service_class is ServiceClass.BATCH:
            return self.batch_priority
        return self.interactive_priority


def by_model(replicas: Iterable[OpenReplica]) -> dict[str, tuple[OpenReplica, ...]]:
    """Model -> the open replicas serving it, by id."""
    index: dict[str, list[OpenReplica]] = {}
    for replica in sorted(replicas, key=lambda r: r.replica_id):
        for model in replica.models:
            index.setdefault(model, []).append(replica)
    return {model: tuple(rs) for model, rs in index.items()}


class OpeningMemory:
    """The opening keys of the turns this dataplane sent to each replica lately: at most
    OPENINGS_PER_REPLICA per replica, the least recently used forgotten first."""

    __slots__ = ("_keys", "_size")

    def __init__(self, size: int = OPENINGS_PER_REPLICA) -> None:
        self._size = size
        self._keys: dict[str, OrderedDict[int, int]] = {}

    def record(self, replica_id: str, opening: Sequence[Key]) -> None:
        keys = self._keys.setdefault(replica_id, OrderedDict())
        for key, size in opening:
            keys[key] = size
            keys.move_to_end(key)
        while len(keys) > self._size:
            keys.popitem(last=False)

    def matched(self, replica_id: str, opening: Sequence[Key]) -> int:
        """Bytes of the longest of `opening` sent to `replica_id` lately (0 for none)."""
        keys = self._keys.get(replica_id)
        if not keys:
            return 0
        return max((size for key, size in opening if key in keys), default=0)


def choose_open(
    open_for_model: tuple[OpenReplica, ...],
    *,
    run: RunRecord | None,
    fresh: bool,
    load: Mapping[str, int],
    opening: Sequence[Key] = (),
    memory: OpeningMemory | None = None,
    pending: Mapping[str, int] | None = None,
    request_bytes: int = 0,
) -> OpenReplica | None:
    """The open replica this dataplane may send the turn to itself, or None to ask.

    `open_for_model`: the open replicas serving the turn's model; `run`: the run table's record
    of the turn's run; `fresh`: the run id was made for this turn; `load`: this dataplane's
    turns in flight per replica; `opening` and `memory`: the turn's opening keys, and where this
    dataplane sent openings lately.
    """
    if not open_for_model:
        return None
    if run is not None:
        return next((r for r in open_for_model if r.replica_id == run.replica_id), None)
    if not fresh:
        return None
    queued = pending or {}

    def cost(replica: OpenReplica) -> tuple[int, int, str]:
        rid = replica.replica_id
        cached = memory.matched(rid, opening) if memory is not None and opening else 0
        own = max(request_bytes - cached, 1)
        return (queued.get(rid, 0) + own, load.get(rid, 0), rid)

    return min(open_for_model, key=cost)
