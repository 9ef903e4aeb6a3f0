"""Builders shared by the scheduler core tests."""

from __future__ import annotations

from luftpause.common.config import Endpoint, EndpointKind
from luftpause.scheduler.core.decide import DEFAULT_RULES, decide, initial_state
from luftpause.scheduler.core.events import Action, Admit, Event, Place, ProbeResult, TurnFinished
from luftpause.scheduler.core.model import Rules, ServiceClass
from luftpause.scheduler.core.state import State

MODEL = "m"
# What an idle engine's probe reports.
IDLE = {"running": 0, "waiting": 0}


def endpoint(
    rid: str, models: tuple[str, ...] = (MODEL,), kind: EndpointKind = EndpointKind.GENERATIVE
) -> Endpoint:
    return Endpoint(id=rid, url=f"http://{rid}:1", models=frozenset(models), kind=kind)


def pool(*ids: str, healthy: bool = True, rules: Rules = DEFAULT_RULES) -> State:
    state = initial_state((endpoint(i) for i in ids), rules=rules)
    for i in ids:
        # Engines of our own report their load (an endpoint that does not is taken to be a
        # hosted API until its first reply: `gate.unread_done`).
        state, _ = decide(state, ProbeResult(at=0.0, replica_id=i, healthy=healthy, **IDLE))
    return state


def cap(state: State, rid: str, running: int, at: float = 0.0) -> State:
    """Make replica `rid` report a waiting queue, so it is capped at `running`."""
    state, _ = decide(
        state, ProbeResult(at=at, replica_id=rid, healthy=True, running=running, waiting=1)
    )
    return state


def admit(
    state: State,
    turn: str,
    run: str,
    *,
    caller: str = "",
    cls: ServiceClass = ServiceClass.INTERACTIVE,
    model: str = MODEL,
    at: float = 1.0,
    size: int = 0,
) -> tuple[State, tuple[Action, ...]]:
    """Admit a turn; `size` is its request's bytes (0: nothing known of its prompt)."""
    return decide(
        state,
        Admit(
            at=at,
            turn_id=turn,
            run_id=run,
            model=model,
            service_class=cls,
            caller=caller,
            prompt_bytes=size,
        ),
    )


def placed(actions: tuple[Action, ...]) -> dict[str, str]:
    """turn id -> replica id for every Place among `actions`."""
    return {a.turn_id: a.replica_id for a in actions if isinstance(a, Place)}


def run_events(state: State, events: list[Event]) -> tuple[State, list[Action]]:
    out: list[Action] = []
    for ev in events:
        state, actions = decide(state, ev)
        out.extend(actions)
    return state, out


def finish(
    state: State, turn: str, *, tool_calls: bool = False, at: float = 2.0
) -> tuple[State, tuple[Action, ...]]:
    return decide(state, TurnFinished(at=at, turn_id=turn, tool_calls=tool_calls))
