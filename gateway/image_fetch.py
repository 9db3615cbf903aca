"""http(s) image URLs of chat messages, fetched by the gateway before the request goes to the
engine (which fetches nothing): each part's bytes put in place of its URL.

    GatewaySettings.allowed_media_domains   hosts a URL may name (none: any)
    GatewaySettings.media_fetch_timeout     seconds for the whole answer
    GatewaySettings.max_media_bytes         the most an answer may hold (read in pieces, so a
                                            larger one is cut off, not held)

A failure is a 400 naming the part's url (`messages[0].content[1].image_url.url`): a host not
allowed, no answer in time, a status other than 200, too many bytes. The images of a request
are fetched at once, and its answer waits for them.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence

import aiohttp
import anyio
import msgspec
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.settings import GatewaySettings
from troupe.messages import ChatMessage, ChatPrompt

CHUNK_BYTES = 64 * 1024


async def fetch_prompt_images(
    prompt: list[ChatMessage] | ChatPrompt, settings: GatewaySettings
) -> list[ChatMessage] | ChatPrompt:
    """A chat prompt (its messages, or them with the template's options) with its images'
    bytes fetched (fetch_images)."""
    if isinstance(prompt, ChatPrompt):
        fetched = await fetch_images(prompt.messages, settings)
        return msgspec.structs.replace(prompt, messages=tuple(fetched))
    return await fetch_images(prompt, settings)


async def fetch_images(
    messages: Sequence[ChatMessage], settings: GatewaySettings
) -> list[ChatMessage]:
    """`messages` with every image part that names a URL given its bytes; a 400 naming the
    part's url when one cannot be had."""
    wanted = [
        (i, j, part.url)
        for i, message in enumerate(messages)
        for j, part in enumerate(message.parts or ())
        if part.type == "image" and part.url and not part.image
    ]
    if not wanted:
        return list(messages)
    got: dict[tuple[int, int], bytes] = {}
    timeout = aiohttp.ClientTimeout(total=settings.media_fetch_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(i: int, j: int, url: str) -> None:
            field = f"messages[{i}].content[{j}].image_url.url"
            got[i, j] = await _fetch(session, url, field, settings)

        try:
            async with anyio.create_task_group() as tg:
                for i, j, url in wanted:
                    tg.start_soon(one, i, j, url)
        except BaseExceptionGroup as group:  # the first part that failed, named
            failed, _ = group.split(ApiError)
            if failed is None:
                raise
            first = failed.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None
    out = list(messages)
    for i, message in enumerate(messages):
        parts = message.parts or ()
        if any((i, j) in got for j in range(len(parts))):
            filled = tuple(
                msgspec.structs.replace(p, image=got[i, j], url="") if (i, j) in got else p
                for j, p in enumerate(parts)
            )
            out[i] = msgspec.structs.replace(message, parts=filled)
    return out


async def _fetch(
    session: aiohttp.ClientSession, url: str, field: str, settings: GatewaySettings
) -> bytes:
    host = urllib.parse.urlsplit(url).hostname or ""
    allowed = settings.allowed_media_domains
    if allowed and host not in allowed:
        raise invalid(field, f"{field}: host {host!r} is not among allowed_media_domains")
    limit = settings.max_media_bytes
    try:
        async with session.get(url) as response:
            if response.status != 200:
                raise invalid(field, f"{field}: fetching the image answered {response.status}")
            data = bytearray()
            async for piece in response.content.iter_chunked(CHUNK_BYTES):
                data += piece
                if len(data) > limit:
                    raise invalid(field, f"{field}: the image is over {limit} bytes")
            return bytes(data)
    except ApiError:
        raise
    except TimeoutError:
        raise invalid(
            field, f"{field}: the image did not arrive in {settings.media_fetch_timeout} s"
        ) from None
    except (aiohttp.ClientError, ValueError) as exc:
        raise invalid(field, f"{field}: the image could not be fetched ({exc})") from None
