"""An image part's URL (OpenAI's `{"type": "image_url", "image_url": {"url": ...}}`) -> the
bytes of the image file, which the engine decodes and checks (actors/core/image_decode.py).

    data:image/png;base64,iVBORw0KGgo...    read here, base64 only (what clients send)
    https://... / http://...                fetched by the route (gateway/image_fetch.py)

The media type a data URL names is not trusted: the engine reads the bytes themselves.
"""

from __future__ import annotations

import base64
import binascii

from troupe.gateway.errors import invalid
from troupe.messages import ChatPart


def image_part(url: str, field: str) -> ChatPart:
    """The image part of a URL: a data URL's bytes, or an http(s) URL left to fetch; a 400
    naming `field` (the url's) for anything else."""
    if url.startswith(("http://", "https://")):
        return ChatPart(type="image", url=url)
    return ChatPart(type="image", image=image_bytes(url, field))


def image_bytes(url: str, field: str) -> bytes:
    """The image file a data URL carries, or a 400 naming `field` (the url's)."""
    head, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma:
        raise invalid(field, f"{field} must be a data URL (data:image/png;base64,...)")
    if not head.endswith(";base64"):
        raise invalid(field, f"{field}: a data URL's image must be base64 (data:...;base64,)")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(field, f"{field}: the data URL's base64 does not decode ({exc})") from None
    if not data:
        raise invalid(field, f"{field}: the data URL holds no bytes")
    return data
