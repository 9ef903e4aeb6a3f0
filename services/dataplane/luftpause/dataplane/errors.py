"""Errors of the dataplane: one root, a code and a retry hint on each.

Pure module: no I/O. Third-party errors (aiohttp, grpc) are mapped to these at the boundary
that meets them (`transport`, `link`) with ``raise ... from exc``; the HTTP shell turns them into
``{"error": {"message": ...}}`` with `status`.

    DataplaneError                    code            status  retryable
    ├── BadRequest                    bad_request     400     no
    │   └── BodyTooLarge              body_too_large  413     no
    ├── ModelNotFound                 model_not_found 404     no
    ├── SchedulerError                scheduler       502     no   (a non-retryable gRPC status)
    ├── SchedulerUnavailable          scheduler_unavailable 503 yes (only where a turn is not held)
    └── EngineError                   engine          502     yes
        ├── EngineUnreachable         engine_unreachable      (no connection, no reply headers)
        └── EngineStreamBroken        engine_stream_broken    (the reply body broke off)
"""

from __future__ import annotations


class DataplaneError(Exception):
    """Root of every error the dataplane raises on purpose."""

    code = "dataplane"
    status = 500
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(DataplaneError):
    """The client's request is malformed; sending it again gets the same answer."""

    code = "bad_request"
    status = 400


class BodyTooLarge(BadRequest):
    """The request body is over the configured limit."""

    code = "body_too_large"
    status = 413


class ModelNotFound(DataplaneError):
    """No generative replica serves the model (the scheduler's NOT_FOUND)."""

    code = "model_not_found"
    status = 404


class RateLimited(DataplaneError):
    """The turn can never fit a rate-limit window (bigger than the whole window), or its key
    has spent its day: the scheduler's RESOURCE_EXHAUSTED, answered with 429 and Retry-After."""

    code = "rate_limited"
    status = 429

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SchedulerError(DataplaneError):
    """The scheduler refused the call with a status that a retry would not change."""

    code = "scheduler"
    status = 502


class SchedulerUnavailable(DataplaneError):
    """The scheduler cannot be reached; turns are held instead, other calls answer with this."""

    code = "scheduler_unavailable"
    status = 503
    retryable = True


class EngineError(DataplaneError):
    """The engine did not deliver a reply; retrying the turn (same run id) may work."""

    code = "engine"
    status = 502
    retryable = True


class EngineUnreachable(EngineError):
    """No connection to the engine, or it closed before sending response headers."""

    code = "engine_unreachable"


class EngineStreamBroken(EngineError):
    """The engine's reply body broke off before its end."""

    code = "engine_stream_broken"
