"""One log line per request at its end, bound to its request_id (debug level: busy servers)."""

from __future__ import annotations

from typing import Any

import structlog
from troupe.messages import Aborted, Failed, Finished, Rejected, StreamEvent

log = structlog.get_logger("troupe.engine")


def log_end(event: StreamEvent) -> None:
    """The end of a request: its finish reason, token counts (when it ran), message (when
    it failed or was turned away)."""
    fields: dict[str, Any] = {"request_id": event.request_id, "finish_reason": event.finish_reason}
    if isinstance(event, Finished | Aborted):
        fields["prompt_tokens"] = event.usage.prompt_tokens
        fields["completion_tokens"] = event.usage.completion_tokens
    elif isinstance(event, Failed | Rejected) and event.message:
        fields["message"] = event.message
    log.debug("request ended", **fields)
