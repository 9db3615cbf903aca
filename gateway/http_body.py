"""Reading a POST body: JSON only, a known content coding, within a size and a deadline.

- Content-Type must be JSON: `text/plain`, form and multipart bodies are what a page on
  another site can POST without the browser asking first (a "simple" cross-site request), so
  taking them as JSON would let any page drive this server. They get 415.
- Content-Encoding: aiohttp decodes gzip and deflate (the size limit counts decoded bytes);
  any other coding gets 415, and a body that does not decode gets 400.
- The body must arrive within `body_timeout` seconds (408): a client that trickles it holds
  a connection and a handler.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from troupe.gateway.errors import ApiError
from troupe.gateway.settings import GatewaySettings

_CODINGS = frozenset({"", "identity", "gzip", "x-gzip", "deflate"})


def is_json_type(content_type: str) -> bool:
    """application/json, or a structured `+json` type (parameters already stripped)."""
    main = content_type.lower()
    return main == "application/json" or (
        main.startswith("application/") and main.endswith("+json")
    )


async def read_json_body(request: web.Request, settings: GatewaySettings) -> bytes:
    """The raw body of a JSON POST, or an ApiError (408, 413, 415 or 400)."""
    if not is_json_type(request.content_type):  # a missing header reads as octet-stream
        raise ApiError(
            415,
            "Content-Type must be application/json, got "
            f"{request.headers.get('Content-Type', 'none')!r:.80}",
            param="Content-Type",
            code="unsupported_media_type",
        )
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    if coding not in _CODINGS:
        raise ApiError(
            415,
            f"Content-Encoding {coding!r:.40} is not supported (gzip, deflate or none)",
            param="Content-Encoding",
            code="unsupported_media_type",
        )
    try:
        async with asyncio.timeout(settings.body_timeout):
            return await request.read()  # aiohttp raises 413 past client_max_size
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {settings.body_timeout:g} s",
            code="request_timeout",
        ) from None
    except web.RequestPayloadError as exc:  # a body that does not decode
        raise ApiError(
            400, f"the request body could not be read: {exc}", param="body", code="invalid_body"
        ) from None
