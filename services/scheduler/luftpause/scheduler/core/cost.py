"""What placing a turn on a replica costs the engines, for turns free to go to any replica.

Pure module: functions of the state, no I/O. A new run (or one free to move) goes to the replica
where it costs least, counted in prompt tokens the engines must read, the unit every engine
spends its time in before a turn can start (as NVIDIA Dynamo's KV router counts blocks to
prefill):

- the reading already queued there: the prompt tokens of the turns in flight there that have not
  shown a first token yet (`Replica.pending_prefill`). A replica that is busy reading has a
  queue of reading ahead of this turn; the count of turns in flight does not say so, since a
  new run's first turn reads its whole task and a continuation a tool result;
- the turn's own reading there (`prefill`): its prompt, less what it is expected to find cached:
  its run's whole context on its own replica, else the opening (tools and first messages) that
  replica served lately (the `openings` rule);
- with the `kv_rule`: the tokens of other runs' resident contexts the replica's pool would push
  out to make room for it, which those runs must read again (`overflow`).

Ties go to the replica with the lower share of its turn cap in use, then fewer turns in flight,
then by id. No term is tuned to an engine: each is a count of tokens the engine reports or the
scheduler learned from usage.
"""

from __future__ import annotations

from luftpause.common.prefixes import matched_bytes
from luftpause.scheduler.core.model import (
    KV_MARGIN_BATCH,
    KV_MARGIN_INTERACTIVE,
    HeldTurn,
    Replica,
    Run,
    ServiceClass,
)
from luftpause.scheduler.core.openings import OpeningIndex
from luftpause.scheduler.core.state import View

_NO_INDEX = OpeningIndex()


def prefill(view: View, turn: HeldTurn, run: Run | None, replica: Replica) -> int:
    """The prompt tokens `turn` is expected to read on `replica` (at least 1)."""
    sizes = view.sizes
    prompt = sizes.prompt_estimate(turn.prompt_bytes)
    if run is not None and run.context_tokens and run.replica == replica.id:
        return max(prompt - run.context_tokens, 1)  # its context is there: only what is new
    if turn.opening and view.rules.openings:
        served = view.openings.get(replica.id, _NO_INDEX).keys
        prompt -= round(matched_bytes(turn.opening, served) * sizes.tokens_per_byte)
    return max(prompt, 1)


def overflow(view: View, turn: HeldTurn, replica: Replica) -> int:
    """Tokens of resident contexts `replica`'s pool would lose to make room for `turn`'s run
    (0 without a known pool, with nothing resident, or with the KV rule off)."""
    pool = replica.kv_tokens
    if not view.rules.kv_rule or pool is None or replica.resident_tokens <= 0:
        return 0
    margin = KV_MARGIN_BATCH if turn.service_class is ServiceClass.BATCH else KV_MARGIN_INTERACTIVE
    need = replica.resident_tokens + view.sizes.first_footprint(turn.prompt_bytes)
    return max(need - int(margin * pool), 0)


def cost(
    view: View, turn: HeldTurn, run: Run | None, replica: Replica
) -> tuple[int, float, int, str]:
    """The sort key of `replica` for `turn`: tokens to read (see the module docstring), then
    the share of its cap in use, turns in flight, id."""
    tokens = replica.pending_prefill + prefill(view, turn, run, replica)
    tokens += overflow(view, turn, replica)
    cap = replica.capacity
    return (tokens, replica.in_flight / cap if cap else 0.0, replica.in_flight, replica.id)
