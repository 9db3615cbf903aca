"""The websocket's API key, out of the URL.

Browsers cannot set headers on a websocket, and a key in the URL (`?api_key=`, still taken for
old clients) ends up in proxy logs and history. So the page offers two subprotocols:
`troupe.v1`, which the server selects, and `troupe.key.<the key, base64url without padding>`,
which it never echoes. The key then travels in the Sec-WebSocket-Protocol header and is checked
by the auth middleware before the socket opens, like a Bearer header (Kubernetes' API server
takes a bearer token from a websocket the same way).
"""

from __future__ import annotations

import base64
import binascii

from troupe.gateway.errors import ApiError

WS_PROTOCOL = "troupe.v1"
KEY_PROTOCOL_PREFIX = "troupe.key."


def key_from_protocols(header: str) -> str | None:
    """The key in a Sec-WebSocket-Protocol header, or None; a 400/401 for a malformed one."""
    offered = [p.strip() for p in header.split(",")]
    encoded = [p[len(KEY_PROTOCOL_PREFIX) :] for p in offered if p.startswith(KEY_PROTOCOL_PREFIX)]
    if not encoded:
        return None
    if WS_PROTOCOL not in offered:
        # Without a protocol to select, aiohttp would log every offered one: the key too.
        raise ApiError(
            400, f"a key subprotocol needs '{WS_PROTOCOL}' offered too", code="invalid_request"
        )
    try:
        return base64.urlsafe_b64decode(encoded[0] + "=" * (-len(encoded[0]) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ApiError(401, "invalid API key", code="invalid_api_key") from None
