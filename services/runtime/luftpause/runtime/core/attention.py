"""A person's attention as a budget: how many approval questions each MCP session may be asked
per rolling hour, the away switches, and the order waiting questions are asked in.

Pure module: frozen values and functions over them; no I/O, no clock reads (times are given,
wall-clock seconds). The shell (`question_gate`) keeps one `Attention` and replaces it on each
change.

A question is one approval a run waits for, keyed `<run>/<call>`. Asking it costs one unit of
the asking session's budget, once: the same question shown again (a repeated call, a task
polled) costs nothing more, and counts from its latest showing. A session may ask while

    no away switch holds it            (its own, or the one for everybody)
    fewer than `per_hour` questions    were asked by it in the last `WINDOW` seconds

`per_hour` 0 means never ask: every question waits for the `approve` tool. Past the budget, a
question waits until the oldest ask in the window leaves it (`Hold.until`); under an away switch
it waits until the switch is off (`until` None). Waiting questions are asked oldest first.

The shell journals each ask and each switch (`attention.jsonl`, format 2 like the run journal):

    {"v":2,"type":"asked","session":S,"key":"<run>/<call>","at":T}
    {"v":2,"type":"away","session":S|"*","on":true|false}

and `replay` folds them through `asked` and `set_away`, so a restarted runtime holds the same
budget and switches. `records` writes a state back as the fewest records that replay to it
(the shell compacts the file with it on start).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

WINDOW = 3600.0
DEFAULT_PER_HOUR = 20
EVERYONE = "*"  # the away switch that holds every session's questions

HoldReason = Literal["away", "budget"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Hold:
    """Why a question may not be asked now, and when it may (None: not by time alone)."""

    reason: HoldReason
    until: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """One question asked by a session."""

    key: str
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Attention:
    """Every session's asks in the window and the away switches (session ids, or `EVERYONE`)."""

    per_hour: int = DEFAULT_PER_HOUR
    asks: tuple[tuple[str, tuple[Ask, ...]], ...] = ()
    away: frozenset[str] = field(default_factory=frozenset)
    window: float = WINDOW  # seconds; an hour but in tests

    def __post_init__(self) -> None:
        if self.per_hour < 0:
            raise ValueError(f"approvals per hour must be at least 0, got {self.per_hour}")
        if self.window <= 0:
            raise ValueError(f"the window must be longer than 0 s, got {self.window}")

    def asked_by(self, session: str, now: float) -> tuple[Ask, ...]:
        """The session's asks still inside the window at `now`, oldest first."""
        mine = next((a for s, a in self.asks if s == session), ())
        return tuple(a for a in mine if a.at > now - self.window)

    def is_away(self, session: str) -> bool:
        return session in self.away or EVERYONE in self.away


def hold(attention: Attention, session: str, key: str, now: float) -> Hold | None:
    """Why `session` may not ask question `key` at `now`; None when it may."""
    if attention.is_away(session):
        return Hold(reason="away")
    recent = attention.asked_by(session, now)
    if any(a.key == key for a in recent):
        return None  # shown again: already paid for
    if attention.per_hour == 0:
        return Hold(reason="budget")
    if len(recent) < attention.per_hour:
        return None
    # The (per_hour)-th newest ask leaves the window first among those that fill it.
    return Hold(reason="budget", until=recent[-attention.per_hour].at + attention.window)


def asked(attention: Attention, session: str, key: str, now: float) -> Attention:
    """`session` asked `key` at `now`. A question shown again is not counted twice; it counts
    from its latest showing, so no hour ever shows a session more than `per_hour` questions."""
    recent = tuple(a for a in attention.asked_by(session, now) if a.key != key)
    others = tuple((s, a) for s, a in attention.asks if s != session and attention.asked_by(s, now))
    return replace(attention, asks=(*others, (session, (*recent, Ask(key=key, at=now)))))


def set_away(attention: Attention, session: str, on: bool) -> Attention:
    """The away switch of `session` (or of `EVERYONE`) on or off."""
    away = attention.away | {session} if on else attention.away - {session}
    return replace(attention, away=frozenset(away))


VERSION = 2  # the run journal's format (`journal.VERSION`), whose decoder reads this file


def asked_record(session: str, key: str, at: float) -> dict[str, Any]:
    return {"v": VERSION, "type": "asked", "session": session, "key": key, "at": at}


def away_record(session: str, on: bool) -> dict[str, Any]:
    return {"v": VERSION, "type": "away", "session": session, "on": on}


def replay(attention: Attention, records: Iterable[dict[str, Any]]) -> Attention:
    """`attention` (its budget and window as configured now) with the journaled asks and
    switches applied in order; records of another kind are skipped."""
    for r in records:
        if r.get("type") == "asked":
            attention = asked(attention, str(r["session"]), str(r["key"]), float(r["at"]))
        elif r.get("type") == "away":
            attention = set_away(attention, str(r["session"]), bool(r["on"]))
    return attention


def records(attention: Attention, now: float) -> list[dict[str, Any]]:
    """The fewest records that replay to `attention`'s asks still in the window at `now` and
    its switches."""
    asks = sorted((a.at, s, a.key) for s, _ in attention.asks for a in attention.asked_by(s, now))
    out = [asked_record(s, key, at) for at, s, key in asks]
    return out + [away_record(s, True) for s in sorted(attention.away)]


def view(attention: Attention, session: str, now: float) -> dict[str, object]:
    """The session's budget as `status` and `away` show it."""
    recent = attention.asked_by(session, now)
    blocked = hold(attention, session, "", now)
    return {
        "session": session,
        "away": attention.is_away(session),
        "awayEveryone": EVERYONE in attention.away,
        "perHour": attention.per_hour,
        "askedLastHour": len(recent),
        "mayAsk": blocked is None,
        "nextAskAt": None if blocked is None else blocked.until,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """A question waiting for its answer: which run and call, about what, since when."""

    handle: str
    call_id: str
    tool: str
    arguments: str
    since: float

    @property
    def key(self) -> str:
        return f"{self.handle}/{self.call_id}"


ARGUMENTS_SHOWN = 200  # characters of a call's arguments a status line shows


def oldest_first(waiting: Iterable[Waiting]) -> list[Waiting]:
    """The order questions are asked in: the longest waiting first, ties by run and call."""
    return sorted(waiting, key=lambda w: (w.since, w.handle, w.call_id))


def describe(w: Waiting, now: float) -> dict[str, object]:
    """One waiting question as `status` lists it."""
    args = w.arguments if len(w.arguments) <= ARGUMENTS_SHOWN else w.arguments[:ARGUMENTS_SHOWN]
    return {
        "handle": w.handle,
        "callId": w.call_id,
        "tool": w.tool,
        "arguments": args + ("…" if len(w.arguments) > ARGUMENTS_SHOWN else ""),
        "since": w.since,
        "waitingSeconds": round(max(0.0, now - w.since), 3),
    }
