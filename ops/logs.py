"""Logging set-up: structlog to stderr, as JSON (msgspec-encoded) or for a console."""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import structlog


def _json(obj: Any, **_: Any) -> bytes:
    return msgspec.json.encode(obj, enc_hook=str)


def configure_logging(fmt: str = "console", level: str = "info") -> None:
    """Configure structlog once for the process. Request ids travel as bound key `request_id`."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"log_level must be a logging level name, got {level!r}")
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    if fmt == "json":
        structlog.configure(
            processors=[
                *shared,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(serializer=_json),
            ],
            logger_factory=structlog.BytesLoggerFactory(sys.stderr.buffer),
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            cache_logger_on_first_use=True,
        )
    else:
        structlog.configure(
            processors=[*shared, structlog.dev.ConsoleRenderer(colors=False)],
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            cache_logger_on_first_use=True,
        )
