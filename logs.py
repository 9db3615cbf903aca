"""Logging set-up: structlog to stderr, as JSON (msgspec-encoded) or for a console."""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import structlog


def _json(obj: Any, **_: Any) -> bytes:
    return msgspec.json.encode(obj, enc_hook=str)


def configure_logging(fmt: str = "console", level: str = "info", stream: Any | None = None) -> None:
    """Configure structlog for the process: JSON lines (msgspec) or console text on `stream`
    (default stderr). Every line about a request carries `request_id`.

    Loggers are not cached on first use, so configuring again (tests, embedding apps) takes
    effect everywhere, module-level loggers included."""
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
            logger_factory=lambda *_: structlog.BytesLogger(
                stream if stream is not None else sys.stderr.buffer  # looked up per logger
            ),
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            cache_logger_on_first_use=False,
        )
    else:
        structlog.configure(
            processors=[*shared, structlog.dev.ConsoleRenderer(colors=False)],
            logger_factory=lambda *_: structlog.PrintLogger(stream or sys.stderr),
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            cache_logger_on_first_use=False,
        )
