"""The image preprocessing a vision-language checkpoint declares, and the pixels it produces.

`read_image_prep` reads `preprocessor_config.json`; `pixel_values` makes the float32 [3, H, W]
array the vision tower reads, step for step as transformers' PIL-backend processors do (what
`AutoImageProcessor` gives without torchvision): [LLaVA do_pad: a square of the mean colour] ->
resize (Pillow) -> center crop -> rescale (float64, then float32) -> normalize (float32).
Processors that cut one image into several (LLaVA-NeXT anyres, Idefics3, Qwen2-VL, Gemma 3's
pan-and-scan) are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# The most pixels of an intermediate image (LLaVA's square, the resize before the crop), which HF
# would allocate whatever the size: a 1x5000 image resized to a 336 short side is 336x1680000.
MAX_WORK_PIXELS = 1 << 26

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_HALF = (0.5, 0.5, 0.5)
_COMMON = {"do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True}
_COMMON |= {"do_convert_rgb": True, "do_center_crop": False, "do_pad": False}
# The class defaults of each PIL processor (models/*/image_processing_pil_*.py) fill in absent
# keys. A null key stays None (ImageProcessingMixin sets it before _set_attributes looks), and
# None reads as false: a null do_convert_rgb turns conversion off, a null resample is an error.
_KEYS = "size", "default_to_square", "resample", "image_mean", "image_std", "crop_size"
_CLIP = {"shortest_edge": 224}, False, 3, _CLIP_MEAN, _CLIP_STD, {"height": 224, "width": 224}
_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "CLIPImageProcessor": _CLIP,
    "LlavaImageProcessor": _CLIP,
    "SiglipImageProcessor": ({"height": 224, "width": 224}, False, 3, _HALF, _HALF, None),
    "Gemma3ImageProcessor": ({"height": 224, "width": 224}, True, 2, _HALF, _HALF, None),
}
_SUPPORTED = ", ".join(_DEFAULTS)


@dataclass(frozen=True)
class ShortestEdge:
    """Resize so the shorter side is `size`, the longer keeping the aspect ratio (int-truncated)."""

    size: int


@dataclass(frozen=True)
class FixedSize:
    """An exact height and width (a resize target or a crop)."""

    height: int
    width: int


@dataclass(frozen=True)
class ImagePrep:
    """One checkpoint's image preprocessing (`resample`: Pillow's filter code; `do_pad`: LLaVA's
    square). `do_convert_rgb` is for the record: `decode_image` always yields RGB."""

    processor_type: str
    size: ShortestEdge | FixedSize
    resample: int
    do_center_crop: bool
    crop_size: FixedSize | None
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    do_convert_rgb: bool
    do_pad: bool

    def __post_init__(self) -> None:
        if self.do_center_crop and self.crop_size is None:
            raise ValueError("do_center_crop is true but crop_size is missing")
        if isinstance(self.size, ShortestEdge) and not (self.do_center_crop or self.do_pad):
            raise ValueError(f"size {{'shortest_edge': {self.size.size}}} needs do_center_crop")
        if self.resample not in range(6):
            raise ValueError(f"resample {self.resample!r} is not a Pillow filter code (0..5)")

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of every `pixel_values` result, known from the config alone."""
        if self.do_center_crop and self.crop_size is not None:
            return self.crop_size.height, self.crop_size.width
        if isinstance(self.size, FixedSize):
            return self.size.height, self.size.width
        return self.size.size, self.size.size  # do_pad: a square keeps its shape


def read_image_prep(folder: Path) -> ImagePrep | None:
    """The preprocessing in `folder`/preprocessor_config.json (as hub checkpoints ship it), or
    else processor_config.json's `image_processor` (as transformers 5 saves a processor); None
    without either. What this module cannot reproduce exactly is a ValueError naming the file,
    the field and its value."""
    path = folder / "preprocessor_config.json"
    nested = not path.is_file()
    if nested:
        path = folder / "processor_config.json"
        if not path.is_file():
            return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from exc
    if nested and isinstance(raw, dict):
        raw = raw.get("image_processor")
        if raw is None:
            return None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    try:
        return _parse(raw)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def pixel_values(
    image: Image.Image, prep: ImagePrep, *, max_work_pixels: int = MAX_WORK_PIXELS
) -> np.ndarray:
    """float32 [3, H, W]: what HF's processor returns as `pixel_values[0]` for this RGB image;
    a ValueError when an intermediate image would exceed `max_work_pixels`."""
    if image.mode != "RGB":
        raise ValueError(f"pixel_values needs an RGB image (decode_image's), got {image.mode}")
    if prep.do_pad:
        image = _pad_to_square(image, prep, max_work_pixels)
    image = _resize_and_crop(image, prep, max_work_pixels)
    pixels = np.asarray(image).transpose(2, 0, 1)
    # image_transforms.rescale: a float64 product, then float32
    values = pixels.astype(np.float64) * prep.rescale_factor if prep.do_rescale else pixels
    values = values.astype(np.float32)
    if prep.do_normalize:  # image_transforms.normalize: float32 mean and std
        mean, std = np.array([prep.image_mean, prep.image_std], dtype=np.float32)[:, :, None, None]
        values = (values - mean) / std
    return np.ascontiguousarray(values)


def _resize_and_crop(image: Image.Image, prep: ImagePrep, max_work_pixels: int) -> Image.Image:
    width, height = image.size
    if isinstance(prep.size, FixedSize):
        new_w, new_h = prep.size.width, prep.size.height
    else:  # image_transforms.get_resize_output_image_size(default_to_square=False)
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(prep.size.size * long / short)
        new_w, new_h = (prep.size.size, new_long) if width <= height else (new_long, prep.size.size)
    if new_w * new_h > max_work_pixels:
        raise ValueError(f"a {width}x{height} image resizes to {new_w}x{new_h}: too many pixels")
    image = image.resize((new_w, new_h), resample=prep.resample)
    if not prep.do_center_crop or (crop := prep.crop_size) is None:
        return image
    # image_transforms.center_crop: floor-divided offsets; a crop larger than the image pads
    # with zeros, as Pillow's crop does outside the image
    left, top = (new_w - crop.width) // 2, (new_h - crop.height) // 2
    return image.crop((left, top, left + crop.width, top + crop.height))


def _pad_to_square(image: Image.Image, prep: ImagePrep, max_work_pixels: int) -> Image.Image:
    """LlavaImageProcessorPil.pad_to_square: centred on a square of the mean colour."""
    width, height = image.size
    side = max(width, height)
    if side * side > max_work_pixels:
        raise ValueError(f"a {width}x{height} image pads to {side}x{side}: too many pixels")
    r, g, b = (int(x * 255) for x in prep.image_mean)
    square = Image.new("RGB", (side, side), (r, g, b))
    square.paste(image, ((side - width) // 2, (side - height) // 2))
    return square


def _parse(raw: dict[str, Any]) -> ImagePrep:
    kind = _processor_type(raw)
    conf = _COMMON | dict(zip(_KEYS, _DEFAULTS[kind], strict=True))
    conf["do_center_crop"] = kind in ("CLIPImageProcessor", "LlavaImageProcessor")
    conf |= raw
    if conf.get("do_pan_and_scan"):
        raise ValueError(f"do_pan_and_scan {conf['do_pan_and_scan']!r} is not supported")
    if not _flag(conf, "do_resize"):
        raise ValueError("do_resize false is not supported: the output shape would vary")
    # The base backend pads a batch to its largest image, a no-op for one image unless pad_size
    # names a larger canvas; LLaVA pads to a square instead; Gemma 3 neither pads nor crops.
    if kind in ("CLIPImageProcessor", "SiglipImageProcessor") and conf.get("pad_size"):
        if _flag(conf, "do_pad"):
            raise ValueError(f"pad_size {conf['pad_size']!r} is not supported")
    do_center_crop = kind != "Gemma3ImageProcessor" and _flag(conf, "do_center_crop")
    crop = conf.get("crop_size") if do_center_crop else None
    crop_size = None if crop is None else _size("crop_size", crop, square=True)
    if isinstance(crop_size, ShortestEdge):
        raise ValueError(f"crop_size {crop!r} is not supported (height and width only)")
    return ImagePrep(
        processor_type=kind,
        size=_size("size", conf["size"], square=_flag(conf, "default_to_square")),
        resample=_int("resample", conf["resample"], lowest=0),
        do_center_crop=do_center_crop,
        crop_size=crop_size,
        do_rescale=_flag(conf, "do_rescale"),
        rescale_factor=_number("rescale_factor", conf["rescale_factor"]),
        do_normalize=_flag(conf, "do_normalize"),
        image_mean=_triple("image_mean", conf["image_mean"]),
        image_std=_triple("image_std", conf["image_std"]),
        do_convert_rgb=_flag(conf, "do_convert_rgb"),
        do_pad=kind == "LlavaImageProcessor" and _flag(conf, "do_pad"),
    )


def _processor_type(raw: dict[str, Any]) -> str:
    """image_processor_type (or the legacy feature_extractor_type) as AutoImageProcessor reads it."""
    if raw.get("auto_map"):
        raise ValueError(f"auto_map {raw['auto_map']!r} (processor code) is not supported")
    name = raw.get("image_processor_type") or raw.get("feature_extractor_type")
    base = str(name).replace("FeatureExtractor", "ImageProcessor").removesuffix("Fast")
    if base not in _DEFAULTS:
        raise ValueError(
            f"image_processor_type {name!r} is not supported (supported: {_SUPPORTED})"
        )
    return base


def _size(field: str, value: Any, *, square: bool) -> ShortestEdge | FixedSize:
    """image_processing_utils.get_size_dict: an int, [height, width], or one of two dicts."""
    if isinstance(value, dict) and set(value) == {"height", "width"}:
        return FixedSize(_int(field, value["height"]), _int(field, value["width"]))
    if isinstance(value, list) and len(value) == 2:
        return FixedSize(_int(field, value[0]), _int(field, value[1]))
    if isinstance(value, dict) and set(value) == {"shortest_edge"}:
        return ShortestEdge(_int(field, value["shortest_edge"]))
    if isinstance(value, int):
        side = _int(field, value)
        return FixedSize(side, side) if square else ShortestEdge(side)
    raise ValueError(f"{field} {value!r} is not supported (shortest_edge, or height and width)")


def _flag(conf: dict[str, Any], field: str) -> bool:
    if not isinstance(conf[field], bool | None):
        raise ValueError(f"{field} {conf[field]!r} is not true or false")
    return bool(conf[field])


def _int(field: str, value: Any, lowest: int = 1) -> int:
    if not isinstance(value, int) or _number(field, value) < lowest:
        raise ValueError(f"{field} {value!r} is not an integer >= {lowest}")
    return value


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):  # JSON true is no number
        raise ValueError(f"{field} {value!r} is not a number")
    return float(value)


def _triple(field: str, value: Any) -> tuple[float, float, float]:
    """A per-channel value; one number stands for all three channels, as in HF's normalize."""
    values = [value] * 3 if isinstance(value, int | float) else value
    if not isinstance(values, list | tuple) or len(values) != 3:
        raise ValueError(f"{field} {value!r} is not a number or a list of 3 numbers")
    a, b, c = (_number(field, v) for v in values)
    return a, b, c
