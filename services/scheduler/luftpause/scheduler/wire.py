"""Core values to and from the scheduler's protobuf messages.

Pure module: no I/O, no clock (the time of an event is an argument). With `rpc`, the only
module of the scheduler that imports the generated code, so the core and the rest of the shell
speak in the core's frozen values. A message's unknown or unset enum value reads as the
default: an interactive class, an idle phase.
"""

from __future__ import annotations

from luftpause.common import ratelimits
from luftpause.rpc import scheduler_pb2 as pb
from luftpause.scheduler.core import events as e
from luftpause.scheduler.core import model as m
from luftpause.scheduler.core.placement import open_replicas
from luftpause.scheduler.core.state import State
from luftpause.scheduler.core.status import status_view

# More keys than a dataplane sends (tools and four messages) are never read.
MAX_OPENING_KEYS = 8
MISSING_FIELDS = "turn_id, run_id and model are required"

_CLASS_IN: dict[int, m.ServiceClass] = {pb.SERVICE_CLASS_BATCH: m.ServiceClass.BATCH}
_CLASS_OUT = {
    m.ServiceClass.INTERACTIVE: pb.SERVICE_CLASS_INTERACTIVE,
    m.ServiceClass.BATCH: pb.SERVICE_CLASS_BATCH,
}
_PHASE_IN: dict[int, m.Phase] = {
    pb.RUN_PHASE_GENERATING: m.Phase.GENERATING,
    pb.RUN_PHASE_TOOL_PAUSED: m.Phase.TOOL_PAUSED,
}
_PHASE_OUT = {
    m.Phase.IDLE: pb.RUN_PHASE_IDLE,
    m.Phase.GENERATING: pb.RUN_PHASE_GENERATING,
    m.Phase.TOOL_PAUSED: pb.RUN_PHASE_TOOL_PAUSED,
}


def service_class(value: int) -> m.ServiceClass:
    return _CLASS_IN.get(value, m.ServiceClass.INTERACTIVE)


def missing_fields(request: pb.AdmitRequest) -> bool:
    """The admission lacks what every turn needs (`MISSING_FIELDS` says what)."""
    return not request.turn_id or not request.model or not (request.run_id or request.single_pass)


def admit_event(request: pb.AdmitRequest, at: float, wall_at: float = 0.0) -> e.Admit:
    """The core event for one admission (or, with `placed_replica_id`, a turn placed already);
    `wall_at` is the wall clock (Unix seconds), for a key's daily quota."""
    key = None
    if request.HasField("key") and request.key.name:
        k = request.key
        key = m.KeyLimits(
            name=k.name,
            tokens_per_minute=max(k.tokens_per_minute, 0),
            requests_per_minute=max(k.requests_per_minute, 0),
            daily_tokens=max(k.daily_tokens, 0),
        )
    return e.Admit(
        at=at,
        turn_id=request.turn_id,
        run_id=request.run_id,
        model=request.model,
        service_class=service_class(request.service_class),
        caller=request.caller,
        dataplane=request.dataplane_id,
        single_pass=request.single_pass,
        placed_on="" if request.single_pass else request.placed_replica_id,
        prompt_bytes=max(request.prompt_bytes, 0),
        opening=tuple(
            (key.hash, key.bytes) for key in request.opening[:MAX_OPENING_KEYS] if key.bytes > 0
        ),
        max_tokens=max(request.max_tokens, 0),
        key=key,
        wall_at=wall_at,
    )


def admit_reply(place: e.Place) -> pb.AdmitReply:
    return pb.AdmitReply(
        turn_id=place.turn_id,
        replica_id=place.replica_id,
        replica_url=place.replica_url,
        held_ms=place.held_s * 1000.0,
        engine_priority=place.engine_priority,
        engine_slot=place.engine_slot,
        slot_save=place.slot_save,
        slot_restore=place.slot_restore,
        slot_save_run=place.slot_save_run,
    )


def placement(place: e.Place) -> pb.Placement:
    """A placement as a Report stream sends it."""
    return pb.Placement(turn_id=place.turn_id, placed=admit_reply(place))


def refusal(turn_id: str, code: int, message: str, retry_after_s: float = 0.0) -> pb.Placement:
    """A refused admission as a Report stream sends it (`code`: a gRPC status code)."""
    refused = pb.Refusal(code=code, message=message, retry_after_seconds=retry_after_s)
    return pb.Placement(turn_id=turn_id, refused=refused)


def reading(message: pb.RateLimitReading, at: float) -> tuple[ratelimits.Reading, float, float]:
    """A reported rate-limit reading, when its headers arrived and when its request went to
    the engine (on the `at` clock)."""
    budgets = {
        b.name: ratelimits.Budget(
            limit=b.limit if b.HasField("limit") and b.limit >= 0 else None,
            remaining=b.remaining if b.HasField("remaining") and b.remaining >= 0 else None,
            reset_s=b.reset_seconds
            if b.HasField("reset_seconds") and b.reset_seconds >= 0
            else None,
        )
        for b in message.budgets
        if b.name in ratelimits.BUDGETS
    }
    retry = message.retry_after_seconds if message.HasField("retry_after_seconds") else None
    value = ratelimits.Reading(
        budgets=budgets, retry_after_s=retry if retry is None or retry >= 0 else None
    )
    read_at = at - max(message.age_ms, 0.0) / 1000.0
    return value, read_at, min(at - max(message.sent_age_ms, 0.0) / 1000.0, read_at)


def turn_event(ev: pb.TurnEvent, at: float) -> e.Event | None:
    """The core event for one reported turn event (None for an empty one)."""
    kind = ev.WhichOneof("kind")
    if kind == "finished":
        u = ev.finished.usage
        read, read_at, sent_at = (None, 0.0, 0.0)
        if ev.finished.HasField("rate_limits"):
            read, read_at, sent_at = reading(ev.finished.rate_limits, at)
        return e.TurnFinished(
            at=at,
            turn_id=ev.turn_id,
            tool_calls=ev.finished.tool_calls,
            prompt_tokens=u.prompt_tokens,
            completion_tokens=u.completion_tokens,
            cached_tokens=u.cached_tokens,
            finish_reason=ev.finished.finish_reason,
            reading=read,
            reading_at=read_at,
            reading_sent_at=sent_at,
        )
    if kind == "failed":
        if not ev.failed.HasField("rate_limits"):
            return e.TurnFailed(at=at, turn_id=ev.turn_id, reason=ev.failed.reason)
        read, read_at, sent_at = reading(ev.failed.rate_limits, at)
        return e.TurnFailed(
            at=at,
            turn_id=ev.turn_id,
            reason=ev.failed.reason,
            reading=read,
            reading_at=read_at,
            reading_sent_at=sent_at,
            refused=ev.failed.rate_limits.refused,
        )
    if kind == "abandoned":
        return e.TurnAbandoned(at=at, turn_id=ev.turn_id)
    if kind == "run_ended":
        return e.RunEnded(at=at, run_id=ev.run_id)
    if kind == "started":
        return e.TurnStarted(at=at, turn_id=ev.turn_id)
    if kind == "first_token":
        return e.FirstToken(at=at, turn_id=ev.turn_id, after_s=ev.first_token.after_s)
    return None


def resync_event(req: pb.ResyncRequest, at: float) -> e.Resync:
    """The core event for a dataplane's Resync: its runs, its placed turns in flight and the
    slot context files it saved."""
    runs = tuple(
        e.RunSnapshot(
            run_id=r.run_id,
            replica=r.replica_id,
            phase=_PHASE_IN.get(r.phase, m.Phase.IDLE),
            service_class=service_class(r.service_class),
            caller=r.caller,
            idle_seconds=max(r.idle_seconds, 0.0),
        )
        for r in req.runs
        if r.run_id
    )
    turns = tuple(
        e.TurnSnapshot(
            turn_id=t.turn_id,
            run_id=t.run_id,
            replica=t.replica_id,
            model=t.model,
            service_class=service_class(t.service_class),
            caller=t.caller,
        )
        for t in req.turns
        if t.turn_id and t.replica_id
    )
    saved = tuple(
        e.SavedSlot(
            replica=f.replica_id, file=f.file, run_id=f.run_id, age_s=max(f.age_seconds, 0.0)
        )
        for f in req.saved
        if f.replica_id and f.file and f.run_id
    )
    return e.Resync(at=at, dataplane=req.dataplane_id, runs=runs, turns=turns, saved=saved)


def resync_reply(event: e.Resync) -> pb.ResyncReply:
    return pb.ResyncReply(runs=len(event.runs), turns=len(event.turns))


def status_reply(state: State, now: float) -> pb.StatusReply:
    """The status (`core.status`) as the Status call answers it; -1 or 0 stand for unknown."""
    view = status_view(state, now)
    reply = pb.StatusReply(turns_in_flight=view["turns_in_flight"])
    for r in view["replicas"]:
        reply.replicas.add(
            id=r["id"],
            url=r["url"],
            healthy=r["healthy"],
            in_flight=r["in_flight"],
            capacity=r["capacity"] or 0,
            capped=r["capped"],
            engine_running=-1 if r["engine_running"] is None else r["engine_running"],
            engine_waiting=-1 if r["engine_waiting"] is None else r["engine_waiting"],
            models=r["models"],
            kind=r["kind"],
            paused_interactive=r["paused_interactive"],
            kv_tokens=r["kv"]["tokens"] or 0,
            kv_used=-1 if r["kv"]["used"] is None else r["kv"]["used"],
            resident_tokens=r["kv"]["resident_tokens"],
            resident_runs=r["kv"]["resident_runs"],
            new_batch_fits=r["kv"]["new_batch_fits"],
            new_interactive_fits=r["kv"]["new_interactive_fits"],
        )
    for g in view["held"]:
        reply.held.add(
            service_class=_CLASS_OUT[m.ServiceClass(g["class"])],
            caller=g["caller"],
            count=g["count"],
            oldest_wait_seconds=g["oldest_wait_s"],
        )
    for phase, by_class in view["runs"].items():
        for cls, count in by_class.items():
            reply.runs.add(
                phase=_PHASE_OUT[m.Phase(phase)],
                service_class=_CLASS_OUT[m.ServiceClass(cls)],
                count=count,
            )
    for b in view["budgets"]:
        budget = reply.budgets.add(
            id=b["id"],
            kind=b["kind"],
            replica_ids=b["replicas"],
            regime=b["regime"],
            k=b["k"],
            cooldown_seconds=b["cooldown_s"],
            held=b["held"],
            in_flight=b["in_flight"],
            reading_age_seconds=-1.0 if b["reading_age_s"] is None else b["reading_age_s"],
            next_fit_seconds=-1.0 if b["next_fit_s"] is None else b["next_fit_s"],
            refused=b["refused"],
            provider_429s=b["provider_429s"],
            used_today=-1 if b["used_today"] is None else b["used_today"],
        )
        for dim in b["dimensions"]:
            budget.dimensions.add(
                name=dim["name"],
                limit=dim["limit"],
                available=-1.0 if dim["available"] is None else dim["available"],
                reserved=dim["reserved"],
                refill_seconds=dim["refill_s"],
            )
    return reply


def open_message(state: State) -> pb.OpenReplicas:
    """The open replicas, as the dataplanes are told them."""
    message = pb.OpenReplicas()
    for replica in open_replicas(state):
        message.replicas.add(
            replica_id=replica.id,
            replica_url=replica.url,
            models=sorted(replica.models),
            interactive_priority=replica.engine_priority(m.ServiceClass.INTERACTIVE),
            batch_priority=replica.engine_priority(m.ServiceClass.BATCH),
        )
    return message


def models_reply(state: State) -> pb.ListModelsReply:
    """Every model served, in name order, with the replicas that serve it."""
    reply = pb.ListModelsReply()
    for model in sorted({*state.generative_by_model.keys(), *state.single_pass_by_model.keys()}):
        ids = (
            *state.generative_by_model.get(model, ()),
            *state.single_pass_by_model.get(model, ()),
        )
        reply.models.add(id=model, replica_ids=ids)
    return reply
