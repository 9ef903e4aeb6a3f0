"""Dataplane values to and from the scheduler's protobuf messages.

Pure module: no I/O. The only module besides `link` that imports the generated code, so the
rest of the dataplane speaks in its own frozen values. Two messages pass through the rest
unopened: the `AdmitRequest` built here goes to `link.admit` or `link.placed`, and a turn's
events built here go to `link.report` (the `Report` callable).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from luftpause.common import ratelimits
from luftpause.common.keys import KeyEntry
from luftpause.dataplane.identity import ServiceClass
from luftpause.dataplane.local import OpenReplica
from luftpause.dataplane.reply import ReplySummary
from luftpause.dataplane.runs import Phase, RunRecord, Snapshot, TurnRecord
from luftpause.rpc import scheduler_pb2 as pb

# Under the 4 MiB a gRPC server accepts by default, with room for the envelope.
RESYNC_MAX_BYTES = 4 * 1024 * 1024 - 64 * 1024

_CLASS = {
    ServiceClass.INTERACTIVE: pb.SERVICE_CLASS_INTERACTIVE,
    ServiceClass.BATCH: pb.SERVICE_CLASS_BATCH,
}
_PHASE = {
    Phase.IDLE: pb.RUN_PHASE_IDLE,
    Phase.GENERATING: pb.RUN_PHASE_GENERATING,
    Phase.TOOL_PAUSED: pb.RUN_PHASE_TOOL_PAUSED,
}

# Where a turn's events go (`link.report`): the event and the replica the turn is on ("" while
# held).
Report: TypeAlias = Callable[[pb.TurnEvent, str], None]
# A reply's rate-limit reading as a turn's end reports it (`rate_limits`).
LimitsMessage: TypeAlias = pb.RateLimitReading


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where the scheduler placed a turn, and what the request to that engine must carry."""

    replica_id: str
    replica_url: str
    held_ms: float = 0.0
    # The request's `priority` field, replacing the client's; None leaves the body alone.
    engine_priority: int | None = None
    # The llama.cpp slot the request names (`id_slot`); None lets the engine pick.
    engine_slot: int | None = None
    # Before the request, save the slot's content to this engine file, then restore the run's
    # context from that one; None for neither.
    slot_save: str | None = None
    slot_restore: str | None = None
    # With `slot_save`: the run whose context the slot holds (the file holds it once saved).
    slot_save_run: str | None = None


def admit_request(
    *,
    turn_id: str,
    run_id: str,
    model: str,
    service_class: ServiceClass,
    caller: str,
    dataplane_id: str,
    prompt_bytes: int = 0,
    opening: Sequence[tuple[int, int]] = (),
    single_pass: bool = False,
    traceparent: str = "",
    key: KeyEntry | None = None,
    max_tokens: int = 0,
) -> pb.AdmitRequest:
    """The Admit call for one turn; the same message is sent again on every retry. A turn
    that came with a key of the keys file carries its name and budget."""
    request = pb.AdmitRequest(
        opening=[pb.OpeningKey(hash=key, bytes=size) for key, size in opening],
        turn_id=turn_id,
        run_id=run_id,
        model=model,
        service_class=_CLASS[service_class],
        caller=caller,
        dataplane_id=dataplane_id,
        prompt_bytes=prompt_bytes,
        single_pass=single_pass,
        traceparent=traceparent,
        max_tokens=max_tokens,
    )
    if key is not None:
        request.key.CopyFrom(key_budget(key))
    return request


def key_budget(key: KeyEntry) -> pb.KeyBudget:
    """A key's name and its own budget (0: none of that kind)."""
    return pb.KeyBudget(
        name=key.name,
        tokens_per_minute=key.tokens_per_minute,
        requests_per_minute=key.requests_per_minute,
        daily_tokens=key.daily_tokens,
    )


def placed_here(request: pb.AdmitRequest, replica_id: str) -> pb.AdmitRequest:
    """`request` as the report of a turn this dataplane placed on the open replica itself."""
    report = pb.AdmitRequest()
    report.CopyFrom(request)
    report.placed_replica_id = replica_id
    return report


def placement(reply: pb.AdmitReply) -> Placement:
    """The scheduler's answer to an Admit, in the dataplane's terms."""
    return Placement(
        replica_id=reply.replica_id,
        replica_url=reply.replica_url,
        held_ms=reply.held_ms,
        engine_priority=reply.engine_priority if reply.HasField("engine_priority") else None,
        engine_slot=reply.engine_slot if reply.HasField("engine_slot") else None,
        slot_save=reply.slot_save if reply.HasField("slot_save") else None,
        slot_restore=reply.slot_restore if reply.HasField("slot_restore") else None,
        slot_save_run=reply.slot_save_run if reply.HasField("slot_save_run") else None,
    )


def open_replicas(message: pb.OpenReplicas) -> list[OpenReplica]:
    """The open replicas the scheduler announced (see `local`)."""
    return [
        OpenReplica(
            replica_id=r.replica_id,
            url=r.replica_url,
            models=frozenset(r.models),
            interactive_priority=(
                r.interactive_priority if r.HasField("interactive_priority") else None
            ),
            batch_priority=r.batch_priority if r.HasField("batch_priority") else None,
        )
        for r in message.replicas
    ]


def started(turn_id: str, run_id: str) -> pb.TurnEvent:
    return pb.TurnEvent(turn_id=turn_id, run_id=run_id, started=pb.TurnStarted())


def first_token(turn_id: str, run_id: str, after_s: float) -> pb.TurnEvent:
    """The engine's first token came `after_s` seconds after the request started."""
    return pb.TurnEvent(
        turn_id=turn_id, run_id=run_id, first_token=pb.FirstToken(after_s=max(after_s, 0.0))
    )


def rate_limits(
    reading: ratelimits.Reading, age_ms: float, sent_age_ms: float, *, refused: bool
) -> pb.RateLimitReading:
    """A reply's rate-limit reading as reported, `age_ms` after its headers arrived and
    `sent_age_ms` after its request went to the engine."""
    message = pb.RateLimitReading(
        age_ms=max(age_ms, 0.0), sent_age_ms=max(sent_age_ms, age_ms, 0.0), refused=refused
    )
    if reading.retry_after_s is not None:
        message.retry_after_seconds = reading.retry_after_s
    for name, budget in reading.budgets.items():
        message.budgets.add(
            name=name,
            limit=budget.limit,
            remaining=budget.remaining,
            reset_seconds=budget.reset_s,
        )
    return message


def finished(
    turn_id: str,
    run_id: str,
    summary: ReplySummary,
    limits: pb.RateLimitReading | None = None,
) -> pb.TurnEvent:
    usage = summary.usage
    return pb.TurnEvent(
        turn_id=turn_id,
        run_id=run_id,
        finished=pb.TurnFinished(
            usage=pb.Usage(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cached_tokens=usage.cached_tokens,
            )
            if usage
            else None,
            finish_reason=summary.finish_reason,
            tool_calls=summary.tool_calls,
            rate_limits=limits,
        ),
    )


def failed(
    turn_id: str, run_id: str, reason: str, limits: pb.RateLimitReading | None = None
) -> pb.TurnEvent:
    return pb.TurnEvent(
        turn_id=turn_id, run_id=run_id, failed=pb.TurnFailed(reason=reason, rate_limits=limits)
    )


def abandoned(turn_id: str, run_id: str) -> pb.TurnEvent:
    return pb.TurnEvent(turn_id=turn_id, run_id=run_id, abandoned=pb.TurnAbandoned())


def run_ended(run_id: str) -> pb.TurnEvent:
    return pb.TurnEvent(run_id=run_id, run_ended=pb.RunEnded())


def _run_snapshot(run: RunRecord, idle: float) -> pb.RunSnapshot:
    return pb.RunSnapshot(
        run_id=run.run_id,
        replica_id=run.replica_id,
        phase=_PHASE[run.phase],
        service_class=_CLASS[run.service_class],
        caller=run.caller,
        idle_seconds=idle,
    )


def _turn_snapshot(turn: TurnRecord) -> pb.TurnSnapshot:
    return pb.TurnSnapshot(
        turn_id=turn.turn_id,
        run_id=turn.run_id,
        replica_id=turn.replica_id,
        model=turn.model,
        service_class=_CLASS[turn.service_class],
        caller=turn.caller,
    )


def resync_request(
    snapshot: Snapshot, dataplane_id: str, max_bytes: int = RESYNC_MAX_BYTES
) -> pb.ResyncRequest:
    """Everything this dataplane knows, in the scheduler's terms, within `max_bytes`.

    gRPC servers refuse messages over 4 MiB by default. Should the snapshot be larger (many
    one-turn runs without a run header), the idle runs that went longest without a turn are
    left out: they carry no affinity, and the scheduler forgets them at idle expiry anyway.
    """
    request = pb.ResyncRequest(
        dataplane_id=dataplane_id,
        turns=[_turn_snapshot(turn) for turn in snapshot.turns],
        saved=[
            pb.SavedSlotFile(replica_id=f.replica_id, file=f.file, run_id=f.run_id, age_seconds=age)
            for f, age in snapshot.saved
        ],
    )
    runs = [_run_snapshot(run, idle) for run, idle in snapshot.runs]
    budget = max_bytes - request.ByteSize()
    if sum(r.ByteSize() + 4 for r in runs) > budget:
        runs.sort(key=lambda r: (r.phase == pb.RUN_PHASE_IDLE, r.idle_seconds))
        kept = 0
        for run in runs:
            budget -= run.ByteSize() + 4  # tag and length prefix, generously
            if budget < 0:
                break
            kept += 1
        runs = runs[:kept]
    request.runs.extend(runs)
    return request
