"""The `share` rule: interactive first, up to a weighted share of the pool.

Pure module: functions that change a `Draft`, no I/O. Held interactive turns go before held
batch turns (`decide._drain`), as the seed asks, while their class has had no more than its
weighted share of its model's pool lately; past it, a batch turn that fits goes first, and an
interactive turn takes only what no batch turn can use. So interactive runs never wait behind
batch while they are few beside it (a pool of engines batching dozens of requests is never
held to the bound by four interactive runs), and on a pool that runs only a few requests at
once they cannot take every slot batch had: there strict priority gave four interactive runs
four to five times the throughput a class-blind router gives them, and took up to a third of
forty-eight batch runs' (bench.family, the llama.cpp models of 2 to 4 slots per replica).

The measure, per model (`ClassShare`): the turn-seconds each class had in flight on the pool,
fading with SHARE_TAU_S; a class's weight is its runs that want the pool now (turns in flight
and held), an interactive one counting `Rules.interactive_weight` (INTERACTIVE_WEIGHT) batch
ones. Interactive is past its share when its turn-seconds exceed w*n_i / (w*n_i + n_b) of both
classes' by more than SHARE_SLACK_S. Single-pass turns and turns held for a rate-limit window
(`gate`) do not count: they wait for other things than the pool's room.
"""

from __future__ import annotations

import math

import immutables

from luftpause.scheduler.core.model import (
    SHARE_SLACK_S,
    SHARE_TAU_S,
    ClassShare,
    HeldTurn,
    ServiceClass,
    Turn,
    evolve,
)
from luftpause.scheduler.core.state import Draft, View

_NONE = ClassShare()


def placed(d: Draft, turn: Turn | HeldTurn, at: float, delta: int) -> None:
    """A turn of the pool went in flight (+1) or ended (-1) at `at`."""
    if not turn.single_pass:
        share = _own(d, turn.model)
        _advance(share, at)
        share.__dict__[_FIELD[turn.service_class, "in_flight"]] += delta


def held(d: Draft, turn: HeldTurn, delta: int) -> None:
    """A turn of the pool was held (+1) or left the queues (-1)."""
    if not turn.single_pass:
        _own(d, turn.model).__dict__[_FIELD[turn.service_class, "held"]] += delta


_FIELD = {
    (cls, what): f"{cls}_{what}"  # e.g. interactive_held
    for cls in (ServiceClass.INTERACTIVE, ServiceClass.BATCH)
    for what in ("in_flight", "held")
}


def _own(d: Draft, model: str) -> ClassShare:
    """`model`'s share as stored in `d`, copied once per step (`Draft.adopt`): the step's
    turns placed, ended, held and taken off the queues count into that one copy."""
    share = d.shares.get(model)
    if share is None or not d.owns(share):
        share = d.adopt(evolve(share or _NONE))
        d.shares = d.shares.set(model, share)
    return share


def past_share(view: View, model: str, at: float) -> bool:
    """Whether held interactive turns of `model` let batch turns that fit go first: the
    `share` rule is on and interactive had more than a turn-second (SHARE_SLACK_S) beyond its
    share lately. (It reads the sums of turns in flight and held per class, which placing a
    turn does not change.)"""
    share = view.shares.get(model)
    if not view.rules.share or share is None:
        return False
    return owed(share, view.rules.interactive_weight, at) > SHARE_SLACK_S


def owed(share: ClassShare, weight: float, at: float) -> float:
    """The turn-seconds interactive had lately beyond its share, as of `at` (negative: short
    of it). Its share is the part of both classes' turn-seconds its runs wanting the pool now
    would have, each weighing `weight` batch runs. The debt fades as the turn-seconds do, so
    after a quiet spell interactive goes first again whatever it had before."""
    now = _advanced(share, at)
    interactive = weight * (now.interactive_in_flight + now.interactive_held)
    batch = now.batch_in_flight + now.batch_held
    bound = interactive / (interactive + batch) if interactive > 0 else 0.0
    return now.interactive_s - bound * (now.interactive_s + now.batch_s)


def part(share: ClassShare, at: float) -> float:
    """Interactive's part of the pool's recent turn-seconds as of `at` (0 before any)."""
    now = _advanced(share, at)
    total = now.interactive_s + now.batch_s
    return now.interactive_s / total if total > 0 else 0.0


def rebuild(d: Draft) -> None:
    """Every pool's counts, counted again from the turns and held turns (the turn-seconds are
    facts, kept)."""
    counts: dict[str, list[int]] = {}
    for t in d.turns.values():
        if not t.single_pass:
            n = counts.setdefault(t.model, [0, 0, 0, 0])
            n[0 if t.service_class is ServiceClass.INTERACTIVE else 1] += 1
    for h in d.held.values():
        if not h.single_pass:
            n = counts.setdefault(h.model, [0, 0, 0, 0])
            n[2 if h.service_class is ServiceClass.INTERACTIVE else 3] += 1
    out: dict[str, ClassShare] = {}
    for model in {*counts, *d.shares.keys()}:
        i_flight, b_flight, i_held, b_held = counts.get(model, (0, 0, 0, 0))
        out[model] = evolve(
            d.shares.get(model, _NONE),
            interactive_in_flight=i_flight,
            batch_in_flight=b_flight,
            interactive_held=i_held,
            batch_held=b_held,
        )
    d.shares = immutables.Map(out)


def _advanced(share: ClassShare, at: float) -> ClassShare:
    """`share` as of `at`: the turn-seconds faded, and those of the turns in flight since."""
    dt = at - share.at
    if dt <= 0:
        return share
    keep = math.exp(-dt / SHARE_TAU_S)
    gained = SHARE_TAU_S * (1.0 - keep)  # one turn in flight since share.at, faded as it went
    return evolve(
        share,
        at=at,
        interactive_s=share.interactive_s * keep + share.interactive_in_flight * gained,
        batch_s=share.batch_s * keep + share.batch_in_flight * gained,
    )


def _advance(share: ClassShare, at: float) -> None:
    """`_advanced`, in place, on a share the draft made (`_own`)."""
    dt = at - share.at
    if dt <= 0:
        return
    keep = math.exp(-dt / SHARE_TAU_S)
    gained = SHARE_TAU_S * (1.0 - keep)
    fields = share.__dict__
    fields["interactive_s"] = share.interactive_s * keep + share.interactive_in_flight * gained
    fields["batch_s"] = share.batch_s * keep + share.batch_in_flight * gained
    fields["at"] = at
