"""Images in a prompt: what a client sends (a chat message's image part) and what the
scheduler and runner carry once the tokenizer has read it (a PromptImage).

    client        ChatPart(type="image", image=<PNG/JPEG bytes>)    in ChatMessage.parts
    tokenizer     decodes and preprocesses it (actors/core/image_prep.py), writes the model's
                  placeholder tokens for it, and records where they are:
    PromptImage   pixels (float32 [3, H, W], raw bytes), start, num_rows, digest
    scheduler     keeps a request's images; each chunk's SeqWork carries those it overlaps
    runner        encodes an image (gpu/vision_encoder.py) and feeds its rows in place of the
                  placeholders' embeddings, as an embeddings prompt's rows are fed

msgspec carries no tensor, so pixels travel as raw little-endian float32 bytes, C order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

PIXEL_ITEMSIZE = 4  # float32


class ChatPart(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One part of a chat message's content, in order: text, or an image as the bytes of its
    file (a data URL's payload, or what the gateway fetched from a URL). `url`: an http(s)
    image the gateway has still to fetch (gateway/image_fetch.py); the engine fetches
    nothing, so it refuses a part that reaches it so."""

    type: Literal["text", "image"]
    text: str = ""
    image: bytes = b""
    url: str = ""


class PromptImage(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One image of a tokenized prompt: its pixel values and the placeholder rows it fills.

    Positions start .. start + num_rows - 1 of the prompt hold the model's image token; the
    vision encoder turns `pixels` into exactly num_rows rows for them. `digest` (a hash of the
    pixels) keys the prefix cache: requests share cached blocks only over the same images."""

    pixels: bytes  # float32 [3, height, width], little-endian, C order
    height: int
    width: int
    start: int
    num_rows: int
    digest: str

    @property
    def stop(self) -> int:
        """The position after its last placeholder."""
        return self.start + self.num_rows

    def overlaps(self, start: int, stop: int) -> bool:
        """Whether positions start .. stop - 1 hold any of its placeholders."""
        return self.start < stop and start < self.stop


def cache_tokens(
    token_ids: Sequence[int], images: tuple[PromptImage, ...], start: int, stop: int
) -> tuple[int, ...]:
    """Positions start .. stop - 1 as the prefix cache keys them: token ids, but an image's
    placeholders as keys of its own (negative, so no token id meets them): row r of an image
    whose 128-bit digest is the words (a, b) is keyed -1 - ((a + r b) mod 2^62). Two images'
    keys agree at one row with odds 2^-62 and at two rows only if their digests do (mod
    2^62): a block of another image is never served. Blocks before an image are shared with
    any prompt that starts the same way; a block over an image only with prompts of the same
    image there (the chain of blocks carries everything before it)."""
    out = list(token_ids[start:stop])
    for image in images:
        if image.overlaps(start, stop):
            a, b = int(image.digest[:16], 16), int(image.digest[16:32], 16)
            for p in range(max(start, image.start), min(stop, image.stop)):
                out[p - start] = -1 - ((a + (p - image.start) * b) & _KEY_MASK)
    return tuple(out)


_KEY_MASK = (1 << 62) - 1  # keys stay in int64, as messages carry them


def whole_image_end(images: tuple[PromptImage, ...], start: int, end: int) -> int:
    """A chunk's `end` that cuts no image (for a model whose image rows attend to each other):
    moved back to the start of the first image it would cut, or to `start` (nothing this
    step) when that image began at or before the chunk."""
    for image in images:
        if image.start < end < image.stop:
            return max(image.start, start)
    return end


def images_in(images: tuple[PromptImage, ...], start: int, stop: int) -> tuple[PromptImage, ...]:
    """The images whose placeholders lie (in part) in positions start .. stop - 1: a chunk's."""
    return tuple(image for image in images if image.overlaps(start, stop))
