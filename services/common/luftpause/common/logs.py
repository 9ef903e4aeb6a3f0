"""Logging setup shared by every process: structlog, JSON in containers, readable on a terminal.

Shell module. `LUFTPAUSE_LOG_FORMAT` (json|console) overrides the choice made from whether
stderr is a terminal; `LUFTPAUSE_LOG_LEVEL` sets the level (default info). With tracing on
(`common.tracing.setup` ran first), every line written while a span is current carries its
`trace_id` and `span_id`.

The libraries' own log records (Python's `logging`: uvicorn, the MCP SDK, gRPC) go through the
same renderer, one JSON object a line beside ours, not in a format of their own: the MCP SDK's
server configures a rich console handler when none is set (multi-line, coloured, and at the
runtime's rate of tool calls a tenth of its CPU). The HTTP clients' line per request (httpx's
"HTTP Request: POST ...", at info) is left out below warning: the runtime makes one per tool call
and model turn, and its own events say more.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

from luftpause.common import tracing

# Loggers that write a line per request at info: kept to warnings and above.
PER_REQUEST = ("httpx", "httpx2", "httpcore", "httpcore2")


def setup_logging(service: str) -> structlog.stdlib.BoundLogger:
    """Configure structlog for this process and return a logger bound to the service name."""
    level_name = os.environ.get("LUFTPAUSE_LOG_LEVEL", "info").upper()
    level = logging.getLevelNamesMapping().get(level_name, logging.INFO)
    fmt = os.environ.get("LUFTPAUSE_LOG_FORMAT") or ("console" if sys.stderr.isatty() else "json")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        *((tracing.add_trace_ids,) if tracing.enabled() else ()),
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    _route_stdlib(service, level, shared, renderer)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(service=service)
    return logger


def _route_stdlib(
    service: str,
    level: int,
    shared: list[structlog.typing.Processor],
    renderer: structlog.typing.Processor,
) -> None:
    """Python's `logging` through `renderer`: one handler on the root logger, so a library's
    `logging.basicConfig` (the MCP SDK's) finds it set and adds none of its own."""

    def named(_: object, __: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
        event.setdefault("service", service)
        return event

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                *shared,
                structlog.stdlib.add_logger_name,
                named,
                structlog.processors.format_exc_info,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in PER_REQUEST:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
