"""Admission by rate-limit budget: hosted endpoints' windows and caller keys' budgets.

Pure module: functions over a `Draft`, no I/O; time and the wall clock arrive as arguments.

A turn goes through the gate when its model is served by a rate-limited replica (one with a
window, `windows`: stated `limits` in the endpoint file, or rate-limit headers seen in a reply),
or when its caller key has a budget. Such a turn is placed only when its predicted cost fits:

- the cost: one request, and prompt tokens estimated from the request's size (by the tokens per
  byte learned from usage; no tokenizer) plus its reply: against a provider's window, the
  request's max_tokens, which hosted APIs count up front (OpenAI's and Anthropic's documented
  rule; `limits.charges`, the default); else the reply expected of its model and caller, capped
  by max_tokens: mean + k sigma of what they replied before (DEFAULT_REPLY_TOKENS before three
  replies), and against a provider's window at least the longest of their recent replies and a
  fading prior (`Replies.bound`: a reply over its reservation can bring the provider's 429);
- its key's window, if the key has a budget (tokens and requests per minute, tokens per day);
- a replica of its model with room (the placement rules' engine load) and, if rate-limited, with
  its window's headroom: the run's own replica first (its prefix may be cached there), then
  any that is not rate-limited, then the one with the most tokens left.

What fits is reserved on every window concerned and the turn is placed at once. A turn whose key
has room but whose model's replicas are not rate-limited reserves its key and joins the placement
queues like any other turn. What does not fit waits in `budget_held`; held turns are tried again
after every event, interactive first, then the caller with fewest turns in flight, then arrival,
and a turn that does not fit blocks the turns behind it on the same windows (so a big turn is not
starved by small ones). The shell ticks at `wake_at`, when the first of them fits by refill.

A turn bigger than every window it could go to (its prompt alone over the whole limit), or whose
key has spent its day, is refused at once: 429 with a Retry-After (a minute, or until midnight
UTC) and a message that says why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from luftpause.common.config import Endpoint
from luftpause.common.ratelimits import Reading
from luftpause.scheduler.core import queues, readings
from luftpause.scheduler.core import windows as w
from luftpause.scheduler.core.learned import Replies
from luftpause.scheduler.core.model import HeldTurn, KeyLimits, Replica, ServiceClass, Turn, evolve
from luftpause.scheduler.core.placement import has_room, mark_read, set_replica
from luftpause.scheduler.core.state import Draft, View

DEFAULT_REPLY_TOKENS = 256
"""The reply predicted before a model and caller have three replies to learn from."""

DAY_S = 86400.0
KEY_PREFIX = "key:"
_NO_REPLIES = Replies()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the gate made of a turn: placed on `replica`, passed on to the placement queues
    (its key reserved), refused (`refusal`), or held (`blocked` on those windows)."""

    replica: Replica | None = None
    passed: bool = False
    refusal: tuple[str, float] | None = None  # (message, retry after s)
    blocked: tuple[str, ...] = ()
    wake_at: float | None = None


def setup(d: Draft, endpoints: Iterable[Endpoint]) -> None:
    """Windows for the endpoints whose file states `limits` (initial state). An endpoint
    without is `Replica.unread` until its first reply or probe."""
    for e in endpoints:
        if e.limits is not None:
            limits = e.limits
            wid = limits.share or e.id
            window = d.windows.get(wid)
            if window is None:
                window = w.stated(
                    wid,
                    limits.per_minute(),
                    0.0,
                    charges_max_tokens=limits.charges == "max_tokens",
                    period_s=limits.window_s,
                )
                if not window.levels:  # nothing stated: learned from the first reply
                    window = evolve(window, own=False, refill=w.Refill())
            _attach(d, window, e.id)


def _attach(d: Draft, window: w.Window, replica_id: str) -> None:
    """`replica_id` is rate-limited by `window` from now on. The turns of its models held in
    the placement queues go to the gate, as if they had arrived now (a key's turn, whose key
    reserved its cost when it passed the gate, stays queued)."""
    if replica_id not in window.replicas:
        window = evolve(window, replicas=(*window.replicas, replica_id))
    d.windows = d.windows.set(window.id, window)
    d.window_of = d.window_of.set(replica_id, window.id)
    replica = d.replicas.get(replica_id)
    if replica is not None and not replica.limited:
        set_replica(d, evolve(replica, limited=True))
        for held in sorted(d.held.values(), key=lambda h: h.seq):
            if held.model in replica.models and not held.single_pass and held.key is None:
                queues.remove(d, held)
                d.budget_held = d.budget_held.set(held.id, held)


def unread_done(d: Draft, replica_id: str) -> None:
    """`replica_id`'s reply came without rate-limit headers: a window the endpoint file asked
    to learn (`limits: {}`) and no reading has filled lets it go: it is not rate-limited,
    until a reply's headers (a 429's) bring a window back (`observe`)."""
    wid = d.window_of.get(replica_id)
    window = None if wid is None else d.windows.get(wid)
    if window is None or window.own or window.levels or window.read_at >= 0:
        return
    d.window_of = d.window_of.delete(replica_id)
    rest = tuple(r for r in window.replicas if r != replica_id)
    if rest:
        d.windows = d.windows.set(window.id, evolve(window, replicas=rest))
    else:
        d.windows = d.windows.delete(window.id)
    replica = d.replicas.get(replica_id)
    if replica is not None and replica.limited:
        set_replica(d, evolve(replica, limited=False))


def applies(view: View, held: HeldTurn) -> bool:
    """Whether `held` goes through the gate (see the module's docstring)."""
    if held.key is not None:
        return not held.single_pass  # its use is counted, against its budget if it has one
    if held.single_pass or not view.window_of:
        return False
    return any(rid in view.window_of for rid in view.generative_by_model.get(held.model, ()))


# --- prediction -------------------------------------------------------------------------------


def caller_base(caller: str) -> str:
    return caller.partition("/")[0]


def prompt_tokens(view: View, held: HeldTurn) -> int:
    return max(view.sizes.prompt_estimate(held.prompt_bytes), 1)


def predict(view: View, held: HeldTurn, window: w.Window | None) -> w.Cost:
    """What `held` is expected to cost against `window` (None: a key's, k at its start)."""
    prompt = prompt_tokens(view, held)
    k = w.K_START if window is None else window.caution.k
    if window is not None and window.charges_max_tokens and held.max_tokens:
        reply = float(held.max_tokens)
    else:
        mine = view.replies.get((held.model, caller_base(held.caller))) or _NO_REPLIES
        fallback = view.replies.get((held.model, ""), _NO_REPLIES)
        if window is None:  # a key's budget: a turn over it waits, nothing is refused
            seen = mine.predict(k)
            seen = fallback.predict(k) if seen is None else seen
        else:  # a provider's: a reply over the reservation can bring its 429
            source = mine if mine.predict(k) is not None else fallback
            seen = source.bound(k, DEFAULT_REPLY_TOKENS)
        reply = DEFAULT_REPLY_TOKENS if seen is None else seen
        if held.max_tokens:
            reply = min(reply, held.max_tokens)
    scale_in, scale_out = (1.0, 1.0) if window is None else window.caution.scale()
    prompt = math.ceil(prompt * scale_in)
    out = max(math.ceil(reply * scale_out), 1)
    return (1, prompt + out, prompt, out)


# --- admission --------------------------------------------------------------------------------


def key_window(d: Draft, key: KeyLimits, at: float, wall_at: float) -> w.Window:
    """The key's window, made or brought in line with the budget the turn came with."""
    wid = KEY_PREFIX + key.name
    window = d.windows.get(wid)
    if window is None:
        window = w.stated(wid, key.per_minute(), at, kind=w.WindowKind.KEY)
    elif {n: lv.limit for n, lv in window.levels.items()} != {
        n: v for n, v in key.per_minute().items() if v
    }:
        window = w.restate(window, key.per_minute(), at)
    day = int(wall_at // DAY_S)
    if window.daily.limit != key.daily_tokens or window.daily.day != day:
        used = window.daily.used if window.daily.day == day else 0
        daily = w.DailyBudget(limit=key.daily_tokens, day=day, used=used)
        window = evolve(window, daily=daily)
    window = w.advance(window, at)
    d.windows = d.windows.set(wid, window)
    return window


def try_admit(d: Draft, held: HeldTurn, at: float) -> Outcome:
    """Place `held` if it fits its key and a replica's window now (see the module)."""
    key = None
    if held.key is not None:
        key = key_window(d, held.key, at, held.wall_at)
        cost = predict(d, held, None)
        daily = key.daily
        if daily.limit and daily.used + cost[2] > daily.limit:
            retry = (daily.day + 1) * DAY_S - held.wall_at
            message = (
                f"key '{held.key.name}' has used {daily.used} of its {daily.limit} tokens "
                "for today (UTC)"
            )
            return Outcome(refusal=(message, max(retry, 1.0)))
        why = w.never_fits(key, (1, cost[2], cost[2], 0))
        if why:
            return Outcome(refusal=(why, w.MINUTE_S))
        if not w.fits(key, cost, at):
            return Outcome(blocked=(key.id,), wake_at=w.fit_at(key, cost, at))
    replicas = [d.replicas[rid] for rid in d.generative_by_model.get(held.model, ())]
    if not any(r.id in d.window_of for r in replicas):
        if key is not None:
            _reserve(d, key.id, held.id, predict(d, held, None))
        return Outcome(passed=True)
    refusal = _never(d, held, replicas)
    if refusal is not None:
        return Outcome(refusal=refusal)
    choice, blocked, wake = _choose(d, held, replicas, at)
    if choice is None:
        return Outcome(blocked=blocked, wake_at=wake)
    if key is not None:
        _reserve(d, key.id, held.id, predict(d, held, None))
    wid = d.window_of.get(choice.id)
    if wid is not None:
        window = w.advance(d.windows[wid], at)
        d.windows = d.windows.set(wid, window)
        _reserve(d, wid, held.id, predict(d, held, window))
    return Outcome(replica=choice)


def _never(d: Draft, held: HeldTurn, replicas: list[Replica]) -> tuple[str, float] | None:
    """A refusal when every replica of the model is rate-limited and none could ever fit it."""
    prompt = prompt_tokens(d, held)
    reasons = []
    for replica in replicas:
        wid = d.window_of.get(replica.id)
        if wid is None:
            return None
        why = w.never_fits(d.windows[wid], (1, prompt, prompt, 0))
        if not why:
            return None
        reasons.append(why)
    return ("; ".join(dict.fromkeys(reasons)), w.MINUTE_S) if reasons else None


def _choose(
    d: Draft, held: HeldTurn, replicas: list[Replica], at: float
) -> tuple[Replica | None, tuple[str, ...], float | None]:
    """The replica `held` goes to, else the windows that held it and when the first fits."""
    run = d.runs.get(held.run_id)
    home = run.replica if run is not None else ""
    free: list[Replica] = []
    limited: list[tuple[float, Replica]] = []
    blocked: list[str] = []
    wake: float | None = None
    for replica in replicas:
        if not replica.healthy or not has_room(replica, held.service_class):
            continue
        wid = d.window_of.get(replica.id)
        if wid is None:
            free.append(replica)
            continue
        window = w.advance(d.windows[wid], at)
        cost = predict(d, held, window)
        if w.fits(window, cost, at):
            left = w.available(window, "tokens", at)
            level = window.levels.get("tokens")
            share = left / level.limit if left is not None and level and level.limit else 1.0
            limited.append((share, replica))
        else:
            blocked.append(wid)
            when = w.fit_at(window, cost, at)
            if when is not None and (wake is None or when < wake):
                wake = when
    for replica in (*free, *(r for _, r in limited)):
        if replica.id == home:
            return replica, (), None
    if free:
        return min(free, key=lambda r: (r.in_flight, r.id)), (), None
    if limited:
        return max(limited, key=lambda pair: (pair[0], pair[1].id))[1], (), None
    return None, tuple(dict.fromkeys(blocked)), wake


def _reserve(d: Draft, wid: str, turn_id: str, cost: w.Cost) -> None:
    d.windows = d.windows.set(wid, w.reserve(d.windows[wid], turn_id, cost))


def held_windows(view: View, held: HeldTurn) -> tuple[str, ...]:
    """The windows a held turn could be blocked on: its key's, its model's replicas'."""
    ids = [KEY_PREFIX + held.key.name] if held.key is not None else []
    for rid in view.generative_by_model.get(held.model, ()):
        wid = view.window_of.get(rid)
        if wid is not None:
            ids.append(wid)
    return tuple(dict.fromkeys(ids))


def order(view: View) -> list[HeldTurn]:
    """The turns held for a window, best first: interactive, fewest in flight, arrival."""
    return sorted(
        view.budget_held.values(),
        key=lambda h: (
            h.service_class is not ServiceClass.INTERACTIVE,
            view.caller_in_flight.get(h.caller, 0),
            h.seq,
        ),
    )


def count_placed(d: Draft, held: HeldTurn, at: float) -> None:
    """A turn its dataplane placed itself (a key without a budget, on an open replica): its
    key's use is counted all the same."""
    if held.key is not None:
        key = key_window(d, held.key, at, held.wall_at)
        _reserve(d, key.id, held.id, predict(d, held, None))


def withdraw(d: Draft, held: HeldTurn, at: float) -> None:
    """A held turn left (its client went away): drop it and any reservation it made."""
    if held.id in d.budget_held:
        d.budget_held = d.budget_held.delete(held.id)
    if held.key is not None:
        release_reservations(d, held.id, held_windows(d, held), None, at, ok=False)


# --- turns in flight --------------------------------------------------------------------------


def windows_of_turn(view: View, held: HeldTurn, replica_id: str) -> tuple[str, ...]:
    """The windows holding a reservation for `held`, placed on `replica_id`."""
    if held.key is None and not view.window_of:
        return ()
    ids = []
    if held.key is not None:
        ids.append(KEY_PREFIX + held.key.name)
    wid = view.window_of.get(replica_id)
    if wid is not None:
        ids.append(wid)
    return tuple(i for i in ids if i in view.windows and held.id in view.windows[i].pending)


def observe(
    d: Draft, turn: Turn, reading: Reading, at: float, sent_at: float, *, refused: bool
) -> None:
    """A reply of `turn`'s replica carried rate-limit headers (arrived at `at`, its request
    sent at `sent_at`): its window learns them; a replica not rate-limited before is from now
    on."""
    wid = d.window_of.get(turn.replica)
    if wid is None:
        replica = d.replicas.get(turn.replica)
        if replica is None:
            return
        wid = turn.replica
        _attach(d, d.windows.get(wid) or w.Window(id=wid), turn.replica)
    mark_read(d, turn.replica)
    window = readings.observe(
        d.windows[wid], reading, at, sent_at=sent_at, turn_id=turn.id, refused=refused
    )
    d.windows = d.windows.set(wid, window)


def settle(
    d: Draft, turn: Turn, at: float, usage: tuple[int, int] | None, *, finished: bool
) -> None:
    """`turn` ended (`finished`: with a reply, whose usage (prompt, completion) is `usage`
    when reported): its reservations go, its real cost is charged where no reading counted it
    (the predicted cost when the reply said no usage), and its reply teaches the prediction."""
    if not turn.windows:
        return
    actual: w.Cost | None = None
    if usage is not None and usage[0] > 0:
        prompt, completion = usage
        actual = (1, prompt + completion, prompt, completion)
        for key in ((turn.model, caller_base(turn.caller)), (turn.model, "")):
            d.replies = d.replies.set(key, d.replies.get(key, _NO_REPLIES).add(completion))
    release_reservations(d, turn.id, turn.windows, actual, at, ok=finished, predicted=finished)


def release_reservations(
    d: Draft,
    turn_id: str,
    ids: Iterable[str],
    actual: w.Cost | None,
    at: float,
    *,
    ok: bool,
    predicted: bool = False,
) -> None:
    """Release a turn's reservations; `actual` is charged (or, with `predicted` and no
    `actual`, what was reserved) where no reading counted it."""
    for wid in ids:
        window = d.windows.get(wid)
        pending = None if window is None else window.pending.get(turn_id)
        if window is None or pending is None:
            continue
        cost = actual if actual is not None or not predicted else pending.cost
        window = w.release(
            window, turn_id, cost, at, ok=ok and window.kind is w.WindowKind.ENDPOINT
        )
        if window.kind is w.WindowKind.KEY and cost is not None:
            daily = evolve(window.daily, used=window.daily.used + cost[1])
            window = evolve(window, daily=daily)
        d.windows = d.windows.set(wid, window)


def refused(d: Draft, ids: Iterable[str]) -> None:
    """Count a never-fits refusal on the windows concerned."""
    for wid in ids:
        window = d.windows.get(wid)
        if window is not None:
            d.windows = d.windows.set(wid, evolve(window, refused=window.refused + 1))
