"""A chat prompt's images, read where requests are tokenized (the Tokenizer actor).

    messages      [user: <image part>, "What is this?"]
    template      "USER: <image>\\nWhat is this? ASSISTANT:"         (the model's own template)
    expanded      "USER: <image><image>...<image>\\nWhat is this?..."   (the processor's rule:
                  tokens_per_image image tokens, Gemma 3's between its begin/end markers)
    ids           [.., 32000 x 576, ..]  -> PromptImage(start, num_rows=576, pixels, digest)

Each image part's bytes are decoded and preprocessed as the checkpoint's image processor does
(actors/core/image_prep.py) in the order the parts come. The template must write one
placeholder per image part (transformers' processors need that too); another count is
refused, naming it, as is an image run of the wrong length (a prompt that writes the image
token itself) or a truncation that cuts into an image.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from troupe.actors.core.image_decode import ImageError, decode_image
from troupe.actors.core.image_prep import ImagePrep, pixel_values
from troupe.gpu.vision_config import VisionConfig
from troupe.messages import ChatMessage, PromptImage


@dataclass(frozen=True, slots=True)
class ImageTokens:
    """How a model's prompt holds an image: the text its chat template writes for one, the
    text that stands in its place before tokenizing, and the token whose rows the vision
    encoder's output replaces (`num_rows` of them)."""

    placeholder: str
    expanded: str
    token_id: int
    num_rows: int


def image_tokens(
    vision: VisionConfig, wrapper: dict[str, object], token_text: Callable[[int], str | None]
) -> ImageTokens:
    """The image tokens of a checkpoint (`wrapper`: its config.json) as its processor writes
    them: LLaVA's image token repeated; Gemma 3's begin marker becomes the image tokens
    between blank lines and its markers (transformers' Gemma3Processor)."""
    image = _text_of(token_text, vision.image_token_index, "image_token_index")
    rows = vision.tokens_per_image
    if vision.projector == "gemma3":
        boi_id = _int(wrapper.get("boi_token_index", 255_999))
        eoi_id = _int(wrapper.get("eoi_token_index", 256_000))
        boi = _text_of(token_text, boi_id, "boi_token_index")
        eoi = _text_of(token_text, eoi_id, "eoi_token_index")
        return ImageTokens(boi, f"\n\n{boi}{image * rows}{eoi}\n\n", vision.image_token_index, rows)
    return ImageTokens(image, image * rows, vision.image_token_index, rows)


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise ValueError(f"config.json: a token index must be an integer, got {value!r}")
    return value


def _text_of(token_text: Callable[[int], str | None], token_id: int, key: str) -> str:
    text = token_text(token_id)
    if not text:
        raise ValueError(f"config.json: {key} {token_id} is no token of the tokenizer")
    return text


@dataclass(frozen=True, slots=True)
class ReadImage:
    """One image part, preprocessed: pixel values float32 [3, H, W] and their digest."""

    pixels: np.ndarray
    digest: str


class PromptImages:
    """The tokenizer's reader of a model's images (None where the model takes none)."""

    def __init__(self, prep: ImagePrep, tokens: ImageTokens, limit: int, max_pixels: int) -> None:
        """`limit`: images a prompt may hold (EngineConfig.limit_images_per_prompt);
        `max_pixels`: the largest image decoded (EngineConfig.max_image_pixels)."""
        self.prep, self.tokens = prep, tokens
        self.limit, self.max_pixels = limit, max_pixels

    def read(self, messages: Sequence[ChatMessage]) -> list[ReadImage]:
        """The messages' image parts, decoded and preprocessed in order; ImageError naming
        the part (or `messages` for too many of them)."""
        found = [
            (f"messages[{i}].content[{j}]", part.image)
            for i, message in enumerate(messages)
            for j, part in enumerate(message.parts or ())
            if part.type == "image"
        ]
        return self.read_files(found, "messages")

    def read_files(self, found: Sequence[tuple[str, bytes]], where: str) -> list[ReadImage]:
        """Image files (each with the field that gave it), decoded and preprocessed in
        order; ImageError naming the field (or `where` for too many of them)."""
        if len(found) > self.limit:
            raise ImageError(where, f"{len(found)} images; limit_images_per_prompt is {self.limit}")
        out = []
        for field, data in found:
            values = pixel_values(decode_image(data, field, self.max_pixels), self.prep)
            pixels = np.ascontiguousarray(values, dtype="<f4")
            h = hashlib.blake2b(digest_size=16)
            h.update(f"{pixels.shape}:".encode())
            h.update(pixels.tobytes())
            out.append(ReadImage(pixels, h.hexdigest()))
        return out

    def expand(self, text: str, num_images: int, field: str = "messages") -> str:
        """The prompt (rendered, or given) with each image's placeholder replaced by its image
        tokens; ImageError naming `field` when their counts differ."""
        placeholder = self.tokens.placeholder
        count = text.count(placeholder)
        if count != num_images:
            writer = "the chat template wrote" if field == "messages" else "the prompt holds"
            raise ImageError(
                field,
                f"{writer} {count} image placeholders ({placeholder!r}) for {num_images} "
                "images; one is needed per image",
            )
        return text.replace(placeholder, self.tokens.expanded)

    def place(
        self, ids: Sequence[int], images: Sequence[ReadImage], field: str
    ) -> tuple[PromptImage, ...]:
        """Each image at its run of image tokens in `ids` (the prompt as it will run,
        truncated); ImageError naming `field` when the runs and the images disagree."""
        token, rows = self.tokens.token_id, self.tokens.num_rows
        starts: list[int] = []
        at, n = 0, len(ids)
        while at < n:
            if ids[at] != token:
                at += 1
                continue
            end = at
            while end < n and ids[end] == token:
                end += 1
            if (end - at) % rows:
                raise ImageError(
                    field,
                    f"a run of {end - at} image tokens at position {at}; each image takes "
                    f"{rows} (the prompt may write the image token itself, or be cut inside an "
                    "image by truncate_prompt_tokens)",
                )
            starts.extend(range(at, end, rows))
            at = end
        if len(starts) != len(images):
            raise ImageError(
                field, f"the prompt holds {len(starts)} images' tokens for {len(images)} images"
            )
        return tuple(
            PromptImage(
                pixels=image.pixels.tobytes(),
                height=int(image.pixels.shape[1]),
                width=int(image.pixels.shape[2]),
                start=start,
                num_rows=rows,
                digest=image.digest,
            )
            for start, image in zip(starts, images, strict=True)
        )
