"""image_decode + image_prep against transformers' own image processors (their PIL backend).

Each config is written as the hub ships it, at small sizes; each image is random noise in one of
Pillow's modes, encoded to bytes; our pixels must equal HF's `pixel_values[0]` for the same file.
"""

import base64
import io
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from transformers import AutoImageProcessor
from transformers.image_utils import load_image
from troupe.actors.core.image_decode import ImageError, decode_image
from troupe.actors.core.image_prep import pixel_values, read_image_prep

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
FIELD = "messages[0].content[1].image_url"
COMMON = {"do_normalize": True, "do_rescale": True, "do_resize": True}
COMMON |= {"rescale_factor": 0.00392156862745098}
CONFIGS: dict[str, dict[str, Any]] = {
    # llava-hf/llava-1.5-7b-hf (openai/clip-vit-large-patch14-336), 336 -> 30 and 28
    "clip": COMMON
    | {"crop_size": {"height": 28, "width": 28}, "do_center_crop": True, "do_convert_rgb": True}
    | {"image_mean": CLIP_MEAN, "image_std": CLIP_STD, "image_processor_type": "CLIPImageProcessor"}
    | {"processor_class": "LlavaProcessor", "resample": 3, "size": {"shortest_edge": 30}},
    # openai/clip-vit-large-patch14-336 itself: the legacy keys, ints for sizes; a crop wider
    # than the resized image, which HF pads with zeros
    "clip_legacy": {"crop_size": 36, "do_center_crop": True, "do_normalize": True}
    | {"do_resize": True, "feature_extractor_type": "CLIPFeatureExtractor", "resample": 3}
    | {"image_mean": CLIP_MEAN, "image_std": CLIP_STD, "size": 33},
    # LLaVA's own processor, padding to a square in the mean colour first
    "llava": COMMON
    | {"crop_size": {"height": 28, "width": 28}, "do_center_crop": True, "do_pad": True}
    | {
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "image_processor_type": "LlavaImageProcessor",
    }
    | {"resample": 3, "size": {"shortest_edge": 28}},
    # google/siglip-so400m-patch14-384: 384x384, bicubic (resample 3 is what the hub file says)
    "siglip": COMMON
    | {"do_convert_rgb": None, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    | {"image_processor_type": "SiglipImageProcessor", "processor_class": "SiglipProcessor"}
    | {"resample": 3, "size": {"height": 32, "width": 32}},
    # google/gemma-3-4b-it: 896x896 bilinear; here not square, to pin height against width
    "gemma3": COMMON
    | {"do_convert_rgb": None, "do_pan_and_scan": None, "image_mean": [0.5] * 3}
    | {"image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256}
    | {"image_std": [0.5] * 3, "pan_and_scan_max_num_crops": None, "resample": 2}
    | {"pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None}
    | {"processor_class": "Gemma3Processor", "size": {"height": 24, "width": 40}},
}
OUTPUT_SIZES = {"clip": (28, 28), "clip_legacy": (36, 36), "llava": (28, 28)}
OUTPUT_SIZES |= {"siglip": (32, 32), "gemma3": (24, 40)}


def write_config(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "preprocessor_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def processors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """name -> (our ImagePrep, HF's processor) for every config."""
    root = tmp_path_factory.mktemp("configs")
    out = {}
    for name, config in CONFIGS.items():
        folder = write_config(root / name, config)
        hf = AutoImageProcessor.from_pretrained(folder, backend="pil")
        assert type(hf).__name__.endswith("Pil"), type(hf)
        out[name] = (read_image_prep(folder), hf)
    return out


def noise(mode: str, width: int, height: int, seed: int) -> Image.Image:
    """Random pixels in `mode` (a P image gets a random palette and a transparent index)."""
    rng = np.random.default_rng(seed)
    if mode == "P":
        indices = rng.integers(0, 16, (height, width), dtype=np.uint8)
        image = Image.frombytes("P", (width, height), indices.tobytes())
        image.putpalette(rng.integers(0, 256, 48, dtype=np.uint8).tolist())
        image.info["transparency"] = 3
        return image
    channels = Image.getmodebands(mode)
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    if mode == "CMYK":
        return Image.frombytes("CMYK", (width, height), pixels.tobytes())
    image = Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels)
    assert image.mode == mode
    return image


def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


CASES = [  # (mode, width, height, format)
    ("RGB", 37, 23, "PNG"),
    ("RGB", 23, 50, "JPEG"),
    ("RGBA", 29, 41, "PNG"),
    ("RGBA", 40, 40, "WEBP"),
    ("L", 64, 19, "PNG"),
    ("L", 19, 19, "JPEG"),
    ("LA", 31, 17, "PNG"),
    ("P", 45, 30, "PNG"),
    ("P", 26, 39, "GIF"),
    ("P", 30, 22, "BMP"),
    ("CMYK", 33, 27, "JPEG"),
    ("RGB", 300, 7, "PNG"),
    ("RGB", 5, 6, "BMP"),
]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize(("mode", "width", "height", "fmt"), CASES)
def test_pixels_equal_hf(
    processors: dict[str, Any], name: str, mode: str, width: int, height: int, fmt: str
) -> None:
    data = encode(noise(mode, width, height, seed=width * height), fmt)
    prep, hf = processors[name]
    # decode_image always converts as HF's convert_to_rgb does; SigLIP's and Gemma 3's hub
    # configs say do_convert_rgb null, with which HF cannot read an L, LA, P or RGBA file at all
    source = Image.open(io.BytesIO(data))
    expected = hf(images=source, do_convert_rgb=True, return_tensors="np")["pixel_values"][0]
    got = pixel_values(decode_image(data, FIELD, max_pixels=10_000), prep)
    assert got.dtype == np.float32 and expected.dtype == np.float32
    assert got.shape == expected.shape == (3, *OUTPUT_SIZES[name])
    assert np.array_equal(got, expected)  # bit for bit
    assert np.unique(got).size > 20  # noise in, noise out


def test_gif_first_frame_webp_and_bmp_decode(processors: dict[str, Any]) -> None:
    frames = [noise("RGB", 12, 9, seed=s) for s in (1, 2)]
    gif = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    first = np.asarray(Image.open(io.BytesIO(gif)).convert("RGB"))
    assert np.array_equal(np.asarray(decode_image(gif, FIELD, 200)), first)
    rgb = noise("RGB", 12, 9, seed=3)
    for fmt, options in (("WEBP", {"lossless": True}), ("BMP", {})):
        decoded = decode_image(encode(rgb, fmt, **options), FIELD, 200)
        assert decoded.mode == "RGB" and np.array_equal(np.asarray(decoded), np.asarray(rgb))


def test_exif_orientation_is_applied_as_hf_load_image_does(processors: dict[str, Any]) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    data = encode(noise("RGB", 40, 25, seed=7), "JPEG", exif=exif)
    decoded = decode_image(data, FIELD, 10_000)
    assert decoded.size == (25, 40)
    prep, hf = processors["clip"]
    upright = load_image(base64.b64encode(data).decode())
    expected = hf(images=upright, return_tensors="np")["pixel_values"][0]
    assert np.abs(pixel_values(decoded, prep) - expected).max() <= 1e-6


def test_sixteen_bit_grey_is_scaled_not_clamped() -> None:
    wide = np.random.default_rng(5).integers(0, 65536, (6, 8), dtype=np.uint16)
    decoded = np.asarray(decode_image(encode(Image.fromarray(wide), "PNG"), FIELD, 100))
    expected = (wide.astype(np.int64) * 255 + 32767) // 65535
    assert decoded.shape == (6, 8, 3) and (decoded == expected[..., None]).all()


def test_output_size_and_fields(processors: dict[str, Any]) -> None:
    for name, (prep, _) in processors.items():
        assert prep.output_size == OUTPUT_SIZES[name]
    clip, siglip, gemma3 = (processors[n][0] for n in ("clip", "siglip", "gemma3"))
    assert (clip.resample, siglip.resample, gemma3.resample) == (3, 3, 2)
    assert clip.do_center_crop and not siglip.do_center_crop and not gemma3.do_center_crop
    assert processors["llava"][0].do_pad and not clip.do_pad
    assert clip.do_convert_rgb and not gemma3.do_convert_rgb  # null is None, and None is false


def test_absent_config_is_none(tmp_path: Path) -> None:
    assert read_image_prep(tmp_path) is None


REFUSALS = [  # (base config, changes, what the message must name)
    ("clip", {"image_processor_type": "Qwen2VLImageProcessor"}, "'Qwen2VLImageProcessor'"),
    ("clip", {"image_processor_type": "LlavaNextImageProcessor"}, "'LlavaNextImageProcessor'"),
    ("clip", {"image_processor_type": None}, "image_processor_type None"),
    ("gemma3", {"do_pan_and_scan": True}, "do_pan_and_scan True"),
    ("siglip", {"size": {"longest_edge": 64}}, "size {'longest_edge': 64}"),
    ("clip", {"crop_size": {"shortest_edge": 20}}, "crop_size {'shortest_edge': 20}"),
    ("clip", {"resample": 9}, "resample 9"),
    ("siglip", {"resample": None}, "resample None"),
    ("clip", {"resample": "bicubic"}, "resample 'bicubic'"),
    ("clip", {"do_resize": False}, "do_resize false"),
    ("clip", {"do_center_crop": False}, "size {'shortest_edge': 30} needs do_center_crop"),
    ("clip", {"image_mean": [0.5, 0.5]}, "image_mean [0.5, 0.5]"),
    ("siglip", {"do_pad": True, "pad_size": {"height": 40, "width": 40}}, "pad_size {'height'"),
    ("clip", {"do_pad": True, "pad_size": 40}, "pad_size 40"),
    ("siglip", {"auto_map": {"AutoImageProcessor": "x.Y"}}, "auto_map {'AutoImageProcessor'"),
    ("siglip", {"do_normalize": "yes"}, "do_normalize 'yes'"),
]


@pytest.mark.parametrize(("base", "changes", "named"), REFUSALS)
def test_unsupported_configs_are_refused(
    tmp_path: Path, base: str, changes: dict[str, Any], named: str
) -> None:
    write_config(tmp_path, CONFIGS[base] | changes)
    with pytest.raises(ValueError) as caught:
        read_image_prep(tmp_path)
    assert str(tmp_path / "preprocessor_config.json") in str(caught.value)
    assert named in str(caught.value)


def test_malformed_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "preprocessor_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"preprocessor_config\.json: cannot read"):
        read_image_prep(tmp_path)


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares `width` x `height` and then breaks off inside its first IDAT."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    idat = struct.pack(">I", 1 << 20) + b"IDAT" + zlib.compress(b"\0" * 64)[:16]
    return b"\x89PNG\r\n\x1a\n" + ihdr + idat


def test_not_an_image() -> None:
    tiff = encode(noise("RGB", 4, 4, seed=1), "TIFF")  # an image, but not a format we take
    for data in (b"hello, world", b"", tiff):
        with pytest.raises(ImageError) as caught:
            decode_image(data, FIELD, 100)
        assert caught.value.field == FIELD
        assert str(caught.value) == f"{FIELD}: not an image (PNG, JPEG, WebP, GIF, BMP)"


def test_too_many_pixels_is_refused_from_the_header() -> None:
    # the body is cut short: decoding it would be a "truncated" error, not this one
    with pytest.raises(ImageError, match=r"5000x5000 = 25000000 pixels, more than the limit"):
        decode_image(png_header(5000, 5000), FIELD, 1_000_000)
    with pytest.raises(ImageError, match="limit of 1000000 pixels"):  # past Pillow's bomb check
        decode_image(png_header(60000, 60000), FIELD, 1_000_000)
    with pytest.raises(ImageError, match="corrupt or truncated PNG"):
        decode_image(png_header(50, 50), FIELD, 1_000_000)
    ten_by_ten = encode(noise("RGB", 10, 10, seed=2), "PNG")
    assert decode_image(ten_by_ten, FIELD, 100).size == (10, 10)
    with pytest.raises(ImageError, match="10x10 = 100 pixels"):
        decode_image(ten_by_ten, FIELD, 99)


def test_zero_size_is_refused() -> None:
    with pytest.raises(ImageError) as caught:
        decode_image(png_header(0, 7), FIELD, 100)
    assert caught.value.field == FIELD


def test_huge_intermediates_are_refused(processors: dict[str, Any]) -> None:
    strip = Image.new("RGB", (400, 2), (200, 30, 90))
    clip, llava = processors["clip"][0], processors["llava"][0]
    with pytest.raises(ValueError, match="400x2 image resizes to 6000x30"):
        pixel_values(strip, clip, max_work_pixels=100_000)
    with pytest.raises(ValueError, match="400x2 image pads to 400x400"):
        pixel_values(strip, llava, max_work_pixels=100_000)
    assert pixel_values(strip, clip, max_work_pixels=180_000).shape == (3, 28, 28)
    with pytest.raises(ValueError, match="RGB image"):
        pixel_values(strip.convert("L"), clip)
