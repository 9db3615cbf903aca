"""Errors in Anthropic's shape, for the /v1/messages paths: `{"type": "error", "error":
{"type", "message"}}`, the status as on every other path. The app's error middleware answers
in this shape on those paths (a missing API key, a body too large, a draining server), and a
broken stream ends with the same object as its `error` event. Having no `param`, the object
names the field a 400 is about in its message."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from troupe.gateway.errors import ApiError

MESSAGES_PATH = "/v1/messages"

_TYPE_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def anthropic_error(error: ApiError) -> dict[str, Any]:
    """The error object; Anthropic's has no `param`, so the message names the field."""
    kind = _TYPE_BY_STATUS.get(error.status, "invalid_request_error")
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_response(error: ApiError) -> web.Response:
    return web.json_response(anthropic_error(error), status=error.status, headers=error.headers)
