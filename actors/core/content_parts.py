"""A chat message's content parts in OpenAI's shape -> the engine's ChatParts, the one reading
of them for every edge (the gateway's bodies, offline dicts); a part that breaks a rule is a
ChatMessageError naming its field (`messages[0].content[1].image_url.url`).

    {"type": "text", "text": "..."}                          text
    {"type": "image_url", "image_url": {"url": URL}}         an image (`image_url` may be
                                                             the URL itself, as vLLM takes it)
    URL  data:image/png;base64,iVBORw0KGgo...                 its bytes, read here (base64)
         https://... / http://...                            left for the gateway to fetch
                                                             (gateway/image_fetch.py): the
                                                             engine fetches nothing

The media type a data URL names is not trusted: the engine reads the bytes themselves.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from troupe.actors.core.chat_messages import ChatMessageError
from troupe.messages import ChatPart


def parts_of(content: Sequence[Any], where: str) -> list[ChatPart]:
    """Content parts as dicts (offline messages) -> ChatParts in order."""
    out = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, Mapping):
            raise ChatMessageError(at, f"{at} must be a content part (an object with a type)")
        image = part.get("image_url")
        if isinstance(image, Mapping):
            image = image.get("url")
        out.append(content_part(part.get("type"), part.get("text"), image, at))
    return out


def content_part(kind: object, text: object, url: object, at: str) -> ChatPart:
    """One part: its `type`, `text` and image URL as the client gave them."""
    if kind == "image_url":
        if url is None:
            raise ChatMessageError(f"{at}.image_url", f"{at}.image_url is missing")
        if not isinstance(url, str):
            raise ChatMessageError(f"{at}.image_url.url", f"{at}.image_url.url must be a string")
        return image_part(url, f"{at}.image_url.url")
    if kind != "text":
        raise ChatMessageError(f"{at}.type", f"{at}: only text and image_url parts are supported")
    if not isinstance(text, str):
        raise ChatMessageError(f"{at}.text", f"{at}.text must be a string")
    return ChatPart(type="text", text=text)


def image_part(url: str, field: str) -> ChatPart:
    """The image part of a URL: a data URL's bytes, or an http(s) URL left to fetch."""
    if url.startswith(("http://", "https://")):
        return ChatPart(type="image", url=url)
    return ChatPart(type="image", image=data_url_bytes(url, field))


def data_url_bytes(url: str, field: str) -> bytes:
    """The image file a data URL carries; ChatMessageError naming `field` (the url's)."""
    head, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma:
        raise ChatMessageError(field, f"{field} must be a data URL (data:image/png;base64,...)")
    if not head.endswith(";base64"):
        raise ChatMessageError(
            field, f"{field}: a data URL's image must be base64 (data:...;base64,)"
        )
    return base64_image(payload, field)


def base64_image(payload: str, field: str) -> bytes:
    """An image file's bytes from base64 text (a data URL's, an Anthropic image block's
    `data`); ChatMessageError naming `field` when it does not decode or holds nothing."""
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ChatMessageError(field, f"{field}: the base64 does not decode ({exc})") from None
    if not data:
        raise ChatMessageError(field, f"{field}: the image holds no bytes")
    return data
