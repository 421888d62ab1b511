"""structlog set-up shared by every specon process: JSON lines on stderr.

Event names are namespaced identifiers (``specon.agent.heartbeat_sent``) with
key-value context, so logs can be filtered and counted without parsing prose.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

Format = Literal["json", "console"]


def configure(*, level: str = "info", fmt: Format = "json") -> None:
    """Configure structlog (and stdlib logging, for libraries) once per process."""
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    logging.basicConfig(level=lvl, stream=sys.stderr, format="%(message)s")
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
