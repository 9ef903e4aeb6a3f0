from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVICE_CLASS_UNSPECIFIED: _ClassVar[ServiceClass]
    SERVICE_CLASS_INTERACTIVE: _ClassVar[ServiceClass]
    SERVICE_CLASS_BATCH: _ClassVar[ServiceClass]

class RunPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_PHASE_UNSPECIFIED: _ClassVar[RunPhase]
    RUN_PHASE_IDLE: _ClassVar[RunPhase]
    RUN_PHASE_GENERATING: _ClassVar[RunPhase]
    RUN_PHASE_TOOL_PAUSED: _ClassVar[RunPhase]
SERVICE_CLASS_UNSPECIFIED: ServiceClass
SERVICE_CLASS_INTERACTIVE: ServiceClass
SERVICE_CLASS_BATCH: ServiceClass
RUN_PHASE_UNSPECIFIED: RunPhase
RUN_PHASE_IDLE: RunPhase
RUN_PHASE_GENERATING: RunPhase
RUN_PHASE_TOOL_PAUSED: RunPhase

class AdmitRequest(_message.Message):
    __slots__ = ("turn_id", "run_id", "model", "service_class", "caller", "dataplane_id", "single_pass", "placed_replica_id", "prompt_bytes", "opening", "traceparent", "max_tokens", "key")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    DATAPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    SINGLE_PASS_FIELD_NUMBER: _ClassVar[int]
    PLACED_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPENING_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    dataplane_id: str
    single_pass: bool
    placed_replica_id: str
    prompt_bytes: int
    opening: _containers.RepeatedCompositeFieldContainer[OpeningKey]
    traceparent: str
    max_tokens: int
    key: KeyBudget
    def __init__(self, turn_id: _Optional[str] = ..., run_id: _Optional[str] = ..., model: _Optional[str] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ..., dataplane_id: _Optional[str] = ..., single_pass: _Optional[bool] = ..., placed_replica_id: _Optional[str] = ..., prompt_bytes: _Optional[int] = ..., opening: _Optional[_Iterable[_Union[OpeningKey, _Mapping]]] = ..., traceparent: _Optional[str] = ..., max_tokens: _Optional[int] = ..., key: _Optional[_Union[KeyBudget, _Mapping]] = ...) -> None: ...

class KeyBudget(_message.Message):
    __slots__ = ("name", "tokens_per_minute", "requests_per_minute", "daily_tokens")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    DAILY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    name: str
    tokens_per_minute: int
    requests_per_minute: int
    daily_tokens: int
    def __init__(self, name: _Optional[str] = ..., tokens_per_minute: _Optional[int] = ..., requests_per_minute: _Optional[int] = ..., daily_tokens: _Optional[int] = ...) -> None: ...

class RateLimitBudget(_message.Message):
    __slots__ = ("name", "limit", "remaining", "reset_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RESET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    limit: int
    remaining: int
    reset_seconds: float
    def __init__(self, name: _Optional[str] = ..., limit: _Optional[int] = ..., remaining: _Optional[int] = ..., reset_seconds: _Optional[float] = ...) -> None: ...

class RateLimitReading(_message.Message):
    __slots__ = ("budgets", "retry_after_seconds", "age_ms", "refused", "sent_age_ms")
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    SENT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    budgets: _containers.RepeatedCompositeFieldContainer[RateLimitBudget]
    retry_after_seconds: float
    age_ms: float
    refused: bool
    sent_age_ms: float
    def __init__(self, budgets: _Optional[_Iterable[_Union[RateLimitBudget, _Mapping]]] = ..., retry_after_seconds: _Optional[float] = ..., age_ms: _Optional[float] = ..., refused: _Optional[bool] = ..., sent_age_ms: _Optional[float] = ...) -> None: ...

class OpeningKey(_message.Message):
    __slots__ = ("hash", "bytes")
    HASH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    hash: int
    bytes: int
    def __init__(self, hash: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class AdmitReply(_message.Message):
    __slots__ = ("turn_id", "replica_id", "replica_url", "held_ms", "engine_priority", "engine_slot", "slot_save", "slot_restore", "slot_save_run")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_URL_FIELD_NUMBER: _ClassVar[int]
    HELD_MS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SLOT_FIELD_NUMBER: _ClassVar[int]
    SLOT_SAVE_FIELD_NUMBER: _ClassVar[int]
    SLOT_RESTORE_FIELD_NUMBER: _ClassVar[int]
    SLOT_SAVE_RUN_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    replica_id: str
    replica_url: str
    held_ms: float
    engine_priority: int
    engine_slot: int
    slot_save: str
    slot_restore: str
    slot_save_run: str
    def __init__(self, turn_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., replica_url: _Optional[str] = ..., held_ms: _Optional[float] = ..., engine_priority: _Optional[int] = ..., engine_slot: _Optional[int] = ..., slot_save: _Optional[str] = ..., slot_restore: _Optional[str] = ..., slot_save_run: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class TurnStarted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FirstToken(_message.Message):
    __slots__ = ("after_s",)
    AFTER_S_FIELD_NUMBER: _ClassVar[int]
    after_s: float
    def __init__(self, after_s: _Optional[float] = ...) -> None: ...

class TurnFinished(_message.Message):
    __slots__ = ("usage", "finish_reason", "tool_calls", "rate_limits")
    USAGE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    usage: Usage
    finish_reason: str
    tool_calls: bool
    rate_limits: RateLimitReading
    def __init__(self, usage: _Optional[_Union[Usage, _Mapping]] = ..., finish_reason: _Optional[str] = ..., tool_calls: _Optional[bool] = ..., rate_limits: _Optional[_Union[RateLimitReading, _Mapping]] = ...) -> None: ...

class TurnFailed(_message.Message):
    __slots__ = ("reason", "rate_limits")
    REASON_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    rate_limits: RateLimitReading
    def __init__(self, reason: _Optional[str] = ..., rate_limits: _Optional[_Union[RateLimitReading, _Mapping]] = ...) -> None: ...

class TurnAbandoned(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunEnded(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TurnEvent(_message.Message):
    __slots__ = ("turn_id", "run_id", "started", "first_token", "finished", "failed", "abandoned", "run_ended")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    RUN_ENDED_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    run_id: str
    started: TurnStarted
    first_token: FirstToken
    finished: TurnFinished
    failed: TurnFailed
    abandoned: TurnAbandoned
    run_ended: RunEnded
    def __init__(self, turn_id: _Optional[str] = ..., run_id: _Optional[str] = ..., started: _Optional[_Union[TurnStarted, _Mapping]] = ..., first_token: _Optional[_Union[FirstToken, _Mapping]] = ..., finished: _Optional[_Union[TurnFinished, _Mapping]] = ..., failed: _Optional[_Union[TurnFailed, _Mapping]] = ..., abandoned: _Optional[_Union[TurnAbandoned, _Mapping]] = ..., run_ended: _Optional[_Union[RunEnded, _Mapping]] = ...) -> None: ...

class DataplaneItem(_message.Message):
    __slots__ = ("admit", "event")
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    admit: AdmitRequest
    event: TurnEvent
    def __init__(self, admit: _Optional[_Union[AdmitRequest, _Mapping]] = ..., event: _Optional[_Union[TurnEvent, _Mapping]] = ...) -> None: ...

class DataplaneBatch(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DataplaneItem]
    def __init__(self, items: _Optional[_Iterable[_Union[DataplaneItem, _Mapping]]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("turn_id", "placed", "refused")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    placed: AdmitReply
    refused: Refusal
    def __init__(self, turn_id: _Optional[str] = ..., placed: _Optional[_Union[AdmitReply, _Mapping]] = ..., refused: _Optional[_Union[Refusal, _Mapping]] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("code", "message", "retry_after_seconds")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    retry_after_seconds: float
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., retry_after_seconds: _Optional[float] = ...) -> None: ...

class OpenReplica(_message.Message):
    __slots__ = ("replica_id", "replica_url", "models", "interactive_priority", "batch_priority")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_URL_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    INTERACTIVE_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    BATCH_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    replica_url: str
    models: _containers.RepeatedScalarFieldContainer[str]
    interactive_priority: int
    batch_priority: int
    def __init__(self, replica_id: _Optional[str] = ..., replica_url: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., interactive_priority: _Optional[int] = ..., batch_priority: _Optional[int] = ...) -> None: ...

class OpenReplicas(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[OpenReplica]
    def __init__(self, replicas: _Optional[_Iterable[_Union[OpenReplica, _Mapping]]] = ...) -> None: ...

class PlacementBatch(_message.Message):
    __slots__ = ("placements", "open", "taken_runs")
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    TAKEN_RUNS_FIELD_NUMBER: _ClassVar[int]
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    open: OpenReplicas
    taken_runs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., open: _Optional[_Union[OpenReplicas, _Mapping]] = ..., taken_runs: _Optional[_Iterable[str]] = ...) -> None: ...

class RunSnapshot(_message.Message):
    __slots__ = ("run_id", "replica_id", "phase", "service_class", "caller", "idle_seconds")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    replica_id: str
    phase: RunPhase
    service_class: ServiceClass
    caller: str
    idle_seconds: float
    def __init__(self, run_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., phase: _Optional[_Union[RunPhase, str]] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ..., idle_seconds: _Optional[float] = ...) -> None: ...

class TurnSnapshot(_message.Message):
    __slots__ = ("turn_id", "run_id", "replica_id", "model", "service_class", "caller")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    run_id: str
    replica_id: str
    model: str
    service_class: ServiceClass
    caller: str
    def __init__(self, turn_id: _Optional[str] = ..., run_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., model: _Optional[str] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ...) -> None: ...

class SavedSlotFile(_message.Message):
    __slots__ = ("replica_id", "file", "run_id", "age_seconds")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    file: str
    run_id: str
    age_seconds: float
    def __init__(self, replica_id: _Optional[str] = ..., file: _Optional[str] = ..., run_id: _Optional[str] = ..., age_seconds: _Optional[float] = ...) -> None: ...

class ResyncRequest(_message.Message):
    __slots__ = ("dataplane_id", "runs", "turns", "saved")
    DATAPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    SAVED_FIELD_NUMBER: _ClassVar[int]
    dataplane_id: str
    runs: _containers.RepeatedCompositeFieldContainer[RunSnapshot]
    turns: _containers.RepeatedCompositeFieldContainer[TurnSnapshot]
    saved: _containers.RepeatedCompositeFieldContainer[SavedSlotFile]
    def __init__(self, dataplane_id: _Optional[str] = ..., runs: _Optional[_Iterable[_Union[RunSnapshot, _Mapping]]] = ..., turns: _Optional[_Iterable[_Union[TurnSnapshot, _Mapping]]] = ..., saved: _Optional[_Iterable[_Union[SavedSlotFile, _Mapping]]] = ...) -> None: ...

class ResyncReply(_message.Message):
    __slots__ = ("runs", "turns")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    runs: int
    turns: int
    def __init__(self, runs: _Optional[int] = ..., turns: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("id", "replica_ids")
    ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., replica_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListModelsReply(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchStatusRequest(_message.Message):
    __slots__ = ("min_interval_ms",)
    MIN_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    min_interval_ms: int
    def __init__(self, min_interval_ms: _Optional[int] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("id", "url", "healthy", "in_flight", "capacity", "capped", "engine_running", "engine_waiting", "models", "kind", "paused_interactive", "kv_tokens", "kv_used", "resident_tokens", "resident_runs", "new_batch_fits", "new_interactive_fits")
    ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    CAPPED_FIELD_NUMBER: _ClassVar[int]
    ENGINE_RUNNING_FIELD_NUMBER: _ClassVar[int]
    ENGINE_WAITING_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAUSED_INTERACTIVE_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_USED_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_RUNS_FIELD_NUMBER: _ClassVar[int]
    NEW_BATCH_FITS_FIELD_NUMBER: _ClassVar[int]
    NEW_INTERACTIVE_FITS_FIELD_NUMBER: _ClassVar[int]
    id: str
    url: str
    healthy: bool
    in_flight: int
    capacity: int
    capped: bool
    engine_running: int
    engine_waiting: int
    models: _containers.RepeatedScalarFieldContainer[str]
    kind: str
    paused_interactive: int
    kv_tokens: int
    kv_used: int
    resident_tokens: int
    resident_runs: int
    new_batch_fits: bool
    new_interactive_fits: bool
    def __init__(self, id: _Optional[str] = ..., url: _Optional[str] = ..., healthy: _Optional[bool] = ..., in_flight: _Optional[int] = ..., capacity: _Optional[int] = ..., capped: _Optional[bool] = ..., engine_running: _Optional[int] = ..., engine_waiting: _Optional[int] = ..., models: _Optional[_Iterable[str]] = ..., kind: _Optional[str] = ..., paused_interactive: _Optional[int] = ..., kv_tokens: _Optional[int] = ..., kv_used: _Optional[int] = ..., resident_tokens: _Optional[int] = ..., resident_runs: _Optional[int] = ..., new_batch_fits: _Optional[bool] = ..., new_interactive_fits: _Optional[bool] = ...) -> None: ...

class HeldGroup(_message.Message):
    __slots__ = ("service_class", "caller", "count", "oldest_wait_seconds")
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    service_class: ServiceClass
    caller: str
    count: int
    oldest_wait_seconds: float
    def __init__(self, service_class: _Optional[_Union[ServiceClass, str]] = ..., caller: _Optional[str] = ..., count: _Optional[int] = ..., oldest_wait_seconds: _Optional[float] = ...) -> None: ...

class RunCount(_message.Message):
    __slots__ = ("phase", "service_class", "count")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    phase: RunPhase
    service_class: ServiceClass
    count: int
    def __init__(self, phase: _Optional[_Union[RunPhase, str]] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., count: _Optional[int] = ...) -> None: ...

class BudgetDimension(_message.Message):
    __slots__ = ("name", "limit", "available", "reserved", "refill_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    REFILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    limit: int
    available: float
    reserved: int
    refill_seconds: float
    def __init__(self, name: _Optional[str] = ..., limit: _Optional[int] = ..., available: _Optional[float] = ..., reserved: _Optional[int] = ..., refill_seconds: _Optional[float] = ...) -> None: ...

class BudgetStatus(_message.Message):
    __slots__ = ("id", "kind", "replica_ids", "regime", "k", "cooldown_seconds", "dimensions", "held", "in_flight", "reading_age_seconds", "next_fit_seconds", "refused", "provider_429s", "used_today")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    REGIME_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    COOLDOWN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    READING_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_429S_FIELD_NUMBER: _ClassVar[int]
    USED_TODAY_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    regime: str
    k: float
    cooldown_seconds: float
    dimensions: _containers.RepeatedCompositeFieldContainer[BudgetDimension]
    held: int
    in_flight: int
    reading_age_seconds: float
    next_fit_seconds: float
    refused: int
    provider_429s: int
    used_today: int
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., replica_ids: _Optional[_Iterable[str]] = ..., regime: _Optional[str] = ..., k: _Optional[float] = ..., cooldown_seconds: _Optional[float] = ..., dimensions: _Optional[_Iterable[_Union[BudgetDimension, _Mapping]]] = ..., held: _Optional[int] = ..., in_flight: _Optional[int] = ..., reading_age_seconds: _Optional[float] = ..., next_fit_seconds: _Optional[float] = ..., refused: _Optional[int] = ..., provider_429s: _Optional[int] = ..., used_today: _Optional[int] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("replicas", "held", "runs", "turns_in_flight", "budgets")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    TURNS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    held: _containers.RepeatedCompositeFieldContainer[HeldGroup]
    runs: _containers.RepeatedCompositeFieldContainer[RunCount]
    turns_in_flight: int
    budgets: _containers.RepeatedCompositeFieldContainer[BudgetStatus]
    def __init__(self, replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., held: _Optional[_Iterable[_Union[HeldGroup, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[RunCount, _Mapping]]] = ..., turns_in_flight: _Optional[int] = ..., budgets: _Optional[_Iterable[_Union[BudgetStatus, _Mapping]]] = ...) -> None: ...
