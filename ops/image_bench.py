"""What an image costs before the language model sees it: the tokenizer's decode and
preprocessing of one photo-sized file (actors/core/image_decode.py, image_prep.py), and the
vision encoder's forward (gpu/vision_encoder.py) at real checkpoints' shapes with random
weights.

    python -m troupe.ops.image_bench [--shape llava-1.5 gemma3] [--batch 1 8] [--device cuda]

Shapes: LLaVA-1.5-7B's CLIP ViT-L/14 at 336 px (feature layer -2, 576 rows into a 4096-wide
Llama) and Gemma 3 4B's SigLIP so400m at 896 px (4096 patches pooled to 256 rows into 2560).
Prints the median ms of the preprocessing per image, and per forward and per image of the
encoder at each batch (bf16 on CUDA, fp32 on the CPU), after a warm-up.
"""

from __future__ import annotations

import argparse
import functools
import io
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image
from troupe.actors.core.image_decode import decode_image
from troupe.actors.core.image_prep import FixedSize, ImagePrep, ShortestEdge, pixel_values
from troupe.gpu.vision_config import VisionConfig
from troupe.gpu.vision_encoder import VisionEncoder

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
SHAPES = {
    "llava-1.5": (
        VisionConfig(tower="clip", hidden_size=1024, intermediate_size=4096, num_layers=24,
                     num_heads=16, image_size=336, patch_size=14, num_channels=3,
                     layer_norm_eps=1e-5, hidden_act="quick_gelu", projector="llava",
                     text_hidden_size=4096, image_token_index=32000),
        ImagePrep(processor_type="CLIPImageProcessor", size=ShortestEdge(336), resample=3,
                  do_center_crop=True, crop_size=FixedSize(336, 336), do_rescale=True,
                  rescale_factor=1 / 255, do_normalize=True, image_mean=CLIP_MEAN,
                  image_std=CLIP_STD, do_convert_rgb=True, do_pad=False),
    ),
    "gemma3": (
        VisionConfig(tower="siglip", hidden_size=1152, intermediate_size=4304, num_layers=27,
                     num_heads=16, image_size=896, patch_size=14, num_channels=3,
                     layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh", projector="gemma3",
                     text_hidden_size=2560, image_token_index=262144, mm_tokens_per_image=256),
        ImagePrep(processor_type="Gemma3ImageProcessor", size=FixedSize(896, 896), resample=2,
                  do_center_crop=False, crop_size=None, do_rescale=True, rescale_factor=1 / 255,
                  do_normalize=True, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                  do_convert_rgb=True, do_pad=False),
    ),
}  # fmt: skip


def median_ms(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def no_sync() -> None:
    pass


def preprocess(data: bytes, prep: ImagePrep) -> np.ndarray:
    """What the tokenizer does to an image part's bytes."""
    return pixel_values(decode_image(data, "image", 10**8), prep)


def photo(width: int = 1024, height: int = 768) -> bytes:
    """A JPEG of smooth random colour at a phone photo's size."""
    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (height // 16, width // 16, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else no_sync
    data = photo()
    print(f"device {device} ({dtype}); photo: 1024x768 JPEG, {len(data)} bytes")
    for name in args.shape:
        config, prep = SHAPES[name]
        prep_ms = median_ms(functools.partial(preprocess, data, prep), args.repeats, no_sync)
        encoder = VisionEncoder(config, dtype, device)
        gen = torch.Generator(device="cpu").manual_seed(0)
        with torch.no_grad():
            for param in encoder.parameters():
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
        print(f"{name}: {config.tokens_per_image} rows an image; preprocess {prep_ms:.1f} ms")
        for batch in args.batch:
            size = config.image_size
            pixels = torch.randn(batch, 3, size, size, generator=gen).to(device)
            ms = median_ms(functools.partial(encoder, pixels), args.repeats, sync)
            print(f"  batch {batch:3d}: {ms:9.1f} ms a forward, {ms / batch:8.1f} ms an image")


if __name__ == "__main__":
    main()
