"""Decode a client's image bytes into the RGB image that Hugging Face's processors start from.

A chat request carries an image as the bytes of a file (an `image_url` part, from a data URL or
a download). `decode_image` opens them with Pillow, refuses what is no image or is too large
before any pixel is decoded, and converts to RGB the way transformers' `convert_to_rgb` does:
transparency is composited onto white, everything else goes through Pillow's `convert("RGB")`.

Two steps go beyond what a processor does with an already open image, as HF's own loader
(`transformers.image_utils.load_image`) and every viewer do:

- the EXIF orientation is applied (`ImageOps.exif_transpose`), so a phone photo stands upright;
- 16-bit greyscale (PNG mode `I;16`) is scaled to 8 bits. Pillow's `convert("RGB")` clamps
  such values at 255, which turns nearly every 16-bit image white; HF inherits that, we don't.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps

# The formats a browser sends. Naming them keeps Pillow's other decoders (PSD, TIFF, EPS via
# Ghostscript, ...) away from untrusted bytes.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_NAMES = "PNG, JPEG, WebP, GIF, BMP"

_SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})


class ImageError(ValueError):
    """A client's image cannot be used; `.field` names the request field that carried it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def decode_image(data: bytes, field: str, max_pixels: int) -> Image.Image:
    """The RGB image in `data` (PNG, JPEG, WebP, BMP, or a GIF's first frame).

    Raises `ImageError(field, ...)` for bytes that are no such image, for a corrupt or truncated
    file, and for an image of zero size or of more than `max_pixels` pixels. The size is read from
    the header, so a decompression bomb is refused before its pixels are inflated.
    """
    limit = f"more than the limit of {max_pixels} pixels"
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    # Pillow's own ceilings, far above any sane limit (the warning raises where warnings do)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(field, f"image has {limit}") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError(field, f"not an image ({_NAMES})") from exc
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageError(field, f"image has zero size ({width}x{height})")
    if width * height > max_pixels:
        raise ImageError(field, f"image is {width}x{height} = {width * height} pixels, {limit}")
    kind = image.format
    try:
        image.load()
        return _to_rgb(ImageOps.exif_transpose(image))
    # Pillow's decoders raise an open-ended set of types on corrupt data (OSError, SyntaxError,
    # EOFError, struct.error, ...); a client's bytes must end as the client's error.
    except Exception as exc:
        raise ImageError(field, f"corrupt or truncated {kind} image: {exc}") from exc


def _to_rgb(image: Image.Image) -> Image.Image:
    """transformers.image_transforms.convert_to_rgb, after 16-bit grey is brought to 8 bits."""
    if image.mode in _SIXTEEN_BIT_MODES:
        wide = np.asarray(image).astype(np.int64).clip(0, 65535)
        image = Image.fromarray(((wide * 255 + 32767) // 65535).astype(np.uint8))
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
