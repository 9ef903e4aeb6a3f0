"""The runtime's exceptions.

Pure module. Tree::

    RuntimeServiceError          code, retryable
    ├── TurnError                a model turn failed for good (the run fails with it)
    │   └── ContextOverflow      the engine said the prompt does not fit its context window
    └── RequestError             a tool call to the runtime was refused: malformed (unknown
        │                        handle, ...), or
        ├── JournalUnwritable    the journal cannot be written now, so no run may begin (retry)
        ├── NoRun                no such run (fork, export)
        ├── Forbidden            the caller's key may not touch the run (`owners`)
        └── BundleError          a bundle `import` refuses; its code says why (`bundle`)
"""

from __future__ import annotations


class RuntimeServiceError(Exception):
    """Root of the runtime's errors: a machine-readable code and whether a retry can help."""

    code = "runtime_error"
    retryable = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class TurnError(RuntimeServiceError):
    code = "turn_failed"


class ContextOverflow(TurnError):
    """The engine refused the prompt as longer than its context window (`window`, when it said);
    the run compacts its history and tries again (`wall`) before it fails with this."""

    code = "context_length_exceeded"

    def __init__(self, message: str, *, window: int | None = None) -> None:
        super().__init__(message, retryable=False)
        self.window = window


class RequestError(RuntimeServiceError):
    code = "bad_request"


class JournalUnwritable(RequestError):
    """The journal's last write failed (a full disk, a failed fsync) and has not succeeded
    since: a new run could not be journaled, so none begins until it can."""

    code = "journal_unwritable"
    retryable = True


class NoRun(RequestError):
    code = "no_run"


class Forbidden(RequestError):
    """The request's key may not touch the run (`owners`)."""

    code = "forbidden"


class BundleError(RequestError):
    """A bundle `import` refuses; `code` says why (see `bundle`'s docstring)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
