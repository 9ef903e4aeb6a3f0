"""Logging setup shared by every process: structlog, JSON in containers, readable on a terminal.

Shell module. `LUFTPAUSE_LOG_FORMAT` (json|console) overrides the choice made from whether
stderr is a terminal; `LUFTPAUSE_LOG_LEVEL` sets the level (default info). With tracing on
(`common.tracing.setup` ran first), every line written while a span is current carries its
`trace_id` and `span_id`.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

from luftpause.common import tracing


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
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *((tracing.add_trace_ids,) if tracing.enabled() else ()),
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(service=service)
    return logger
