"""The objects one dataplane process shares across requests.

Shell module: a plain holder, built once by `app.build_app` and reached from handlers through
`request.app[DATAPLANE]`.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from luftpause.common.keys import KeyEntry
from luftpause.dataplane.apis import CHAT_ONLY, Api
from luftpause.dataplane.identity import ServiceClass, ToolCallMemory
from luftpause.dataplane.link import SchedulerLink
from luftpause.dataplane.local import OpeningMemory
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.slotfiles import FileOrder
from luftpause.dataplane.transport import EngineTransport
from luftpause.dataplane.turn import Turn

if TYPE_CHECKING:
    from luftpause.dataplane.spans import TurnSpan

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# How long `GET /v1/models` waits for an unreachable scheduler when there is no endpoint file.
MODELS_HOLD_SECONDS = 30.0
# How long, in all, a turn an engine refused for its rate limit waits to be sent again.
RATE_LIMIT_WAIT_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """What the endpoint file says of a replica for the dataplane: the APIs it serves itself,
    the header its API key goes in, and its URL and models (for token counts)."""

    apis: frozenset[Api] = CHAT_ONLY
    key_header: str = "authorization"
    url: str = ""
    models: frozenset[str] = frozenset()


CHAT_SERVED = Served()


@dataclass(kw_only=True, slots=True)
class Dataplane:
    """Scheduler link, engine transport, the run table and tool call memory, metrics, keys,
    the order of saved slot context calls, and the endpoint file's models.
    """

    dataplane_id: str
    link: SchedulerLink
    transport: EngineTransport
    runs: RunTable
    memory: ToolCallMemory
    metrics: Metrics = field(default_factory=Metrics)
    api_keys: Mapping[str, str] = field(default_factory=dict)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Place turns on open replicas without asking the scheduler (see `local`), and where this
    # dataplane sent each opening lately.
    local_placement: bool = True
    openings: OpeningMemory = field(default_factory=OpeningMemory)
    # Saved slot contexts: the engine's calls on one file in the order turns were placed.
    slot_order: FileOrder = field(default_factory=FileOrder)
    # What `GET /v1/models` lists while the scheduler cannot be reached (the endpoint file's
    # generative models; None without a file: the request waits for the scheduler instead).
    config_models: tuple[str, ...] | None = None
    models_hold_seconds: float = MODELS_HOLD_SECONDS
    # How long a turn refused for its rate limit waits, in all, to be sent again (see `proxy`).
    rate_limit_wait_s: float = RATE_LIMIT_WAIT_S
    # Per replica, its provider's own names for the standard rate-limit headers (endpoint
    # `limits.headers`: standard name -> theirs).
    limit_headers: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Per replica, the APIs it serves and where its key goes (a replica not named: `CHAT_SERVED`).
    served: Mapping[str, Served] = field(default_factory=dict)
    models_retry_seconds: float = 1.0
    clock: Callable[[], float] = time.monotonic
    # Turn ids: 64 random bits per process, then a counter, 32 hex digits like a uuid4's. Unique
    # across dataplanes and restarts as uuid4s are, without a getrandom call per turn.
    _id_prefix: str = field(default_factory=lambda: os.urandom(8).hex())
    _id_counter: Iterator[int] = field(default_factory=itertools.count)

    def served_by(self, replica_id: str) -> Served:
        """What the endpoint file says of `replica_id` (Chat Completions only if nothing)."""
        return self.served.get(replica_id, CHAT_SERVED)

    def next_turn_id(self) -> str:
        """A new turn id."""
        return f"{self._id_prefix}{next(self._id_counter):016x}"

    def new_turn(
        self,
        *,
        turn_id: str,
        run_id: str,
        model: str,
        service_class: ServiceClass,
        caller: str,
        request_bytes: int,
        single_pass: bool = False,
        span: TurnSpan | None = None,
        key: KeyEntry | None = None,
    ) -> Turn:
        """A turn wired to this process's link, tables and metrics (and its span, if traced)."""
        return Turn(
            turn_id=turn_id,
            run_id=run_id,
            model=model,
            service_class=service_class,
            caller=caller,
            request_bytes=request_bytes,
            single_pass=single_pass,
            report=self.link.report,
            span=span,
            key=key,
            runs=self.runs,
            memory=self.memory,
            metrics=self.metrics,
            clock=self.clock,
        )


DATAPLANE = web.AppKey("dataplane", Dataplane)
