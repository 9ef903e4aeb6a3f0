"""Dataplane values to and from the scheduler's protobuf messages.

Pure module: no I/O. The only module besides `link` that imports the generated code, so the
rest of the dataplane speaks in its own frozen values.
"""

from __future__ import annotations

from collections.abc import Sequence

from luftpause.dataplane.identity import ServiceClass
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
) -> pb.AdmitRequest:
    """The Admit call for one turn; the same message is sent again on every retry."""
    return pb.AdmitRequest(
        opening=[pb.OpeningKey(hash=key, bytes=size) for key, size in opening],
        turn_id=turn_id,
        run_id=run_id,
        model=model,
        service_class=_CLASS[service_class],
        caller=caller,
        dataplane_id=dataplane_id,
        prompt_bytes=prompt_bytes,
    )


def started(turn_id: str, run_id: str) -> pb.TurnEvent:
    return pb.TurnEvent(turn_id=turn_id, run_id=run_id, started=pb.TurnStarted())


def first_token(turn_id: str, run_id: str) -> pb.TurnEvent:
    return pb.TurnEvent(turn_id=turn_id, run_id=run_id, first_token=pb.FirstToken())


def finished(turn_id: str, run_id: str, summary: ReplySummary) -> pb.TurnEvent:
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
        ),
    )


def failed(turn_id: str, run_id: str, reason: str) -> pb.TurnEvent:
    return pb.TurnEvent(turn_id=turn_id, run_id=run_id, failed=pb.TurnFailed(reason=reason))


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
