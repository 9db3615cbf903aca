"""Errors in OpenAI's shape, and how engine rejections map to HTTP statuses.

Every error the gateway sends, on HTTP or in an SSE stream, is
`{"error": {"message", "type", "param", "code"}}`; websocket errors use the same codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web
from troupe.messages import Aborted, Failed, FailureCause, RejectCode, Rejected

RETRY_AFTER_SECONDS = 1  # what a 429 tells the client; queues drain within a few steps

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    502: "internal_server_error",  # the router: a replica failed while answering
    503: "service_unavailable",
}


class ApiError(Exception):
    """An error to answer with: HTTP status, message, the offending field and a short code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body: OpenAI's error object."""
        return {
            "error": {
                "message": self.message,
                "type": _TYPE_BY_STATUS.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


def invalid(param: str, message: str) -> ApiError:
    """A 400 naming the bad field."""
    return ApiError(400, message, param=param, code="invalid_value")


# The engine names a token-id prompt `prompt_token_ids`; clients sent it as `prompt`.
_CLIENT_FIELDS = {"prompt_token_ids": "prompt"}


def client_field(engine_field: str | None, fields: Mapping[str, str] | None = None) -> str | None:
    """The request field a client wrote, for a field named in an engine rejection (`fields`:
    this request's own renames, e.g. structured_outputs.json -> guided_json)."""
    if not engine_field:
        return engine_field
    if fields and engine_field in fields:
        return fields[engine_field]
    return _CLIENT_FIELDS.get(engine_field, engine_field)


def error_for_event(
    event: Rejected | Aborted | Failed, fields: Mapping[str, str] | None = None
) -> ApiError:
    """The HTTP error that stands for an engine's non-normal terminal event."""
    if isinstance(event, Rejected):
        match event.code:
            case RejectCode.OVERLOADED:
                return ApiError(
                    429,
                    event.message,
                    code="overloaded",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                )
            case RejectCode.SHUTTING_DOWN:
                return ApiError(503, event.message, code="shutting_down")
            case RejectCode.TOO_LONG:
                return ApiError(
                    400,
                    event.message,
                    param=client_field(event.field, fields),
                    code="context_length_exceeded",
                )
            case _:
                return ApiError(
                    400,
                    event.message,
                    param=client_field(event.field, fields),
                    code="invalid_value",
                )
    if isinstance(event, Aborted):
        return ApiError(503, f"request aborted: {event.reason}", code="aborted")
    if event.cause is FailureCause.GRAMMAR_DEAD_END:  # the client's grammar, not our fault
        field = client_field("structured_outputs", fields)
        return ApiError(400, f"invalid '{field}': {event.message}", param=field, code=event.cause)
    return ApiError(500, f"request failed: {event.message}", code="internal_error")


def internal_error(exc: Exception) -> ApiError:
    """The 500 that answers a bug (its traceback belongs in the log)."""
    return ApiError(500, f"internal error: {exc!r}", code="internal_error")


def from_http_exception(exc: web.HTTPException) -> ApiError:
    """aiohttp's own errors (413 from client_max_size, 404/405 routing) in OpenAI's shape."""
    if exc.status == 413:
        message = f"request body too large: {exc.text or 'over the limit'}"
        return ApiError(413, message, code="request_too_large")
    message = exc.reason if exc.status in (404, 405) else (exc.text or exc.reason)
    return ApiError(exc.status, message, code=None)
