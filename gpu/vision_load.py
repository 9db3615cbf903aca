"""The vision encoder of a multimodal checkpoint, loaded beside its text model when the engine
takes images (EngineConfig.limit_images_per_prompt > 0).

    config.json        the wrapper's vision_config and projector fields (gpu/vision_config.py)
    *.safetensors      only the vision tower's and projector's tensors are read here, by name
                       (gpu/text_part.py reads the text model's)

Which wrappers read images: LLaVA-1.5-style `llava` (a CLIP or SigLIP tower, an MLP
projector). Gemma 3's encoder is built (gpu/vision_encoder.py) but not loaded: its language
model attends bidirectionally within each image's rows, which troupe's paged attention does
not do yet, so its answers would differ from the checkpoint's. It and the other wrappers are
served text-only, their images refused where requests are tokenized.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from troupe.gpu.model_config import ModelLoadError
from troupe.gpu.safetensors_shards import open_shards
from troupe.gpu.vision_config import read_vision_config
from troupe.gpu.vision_encoder import VisionEncoder, is_vision_tensor
from troupe.gpu.weights import safetensors_files

IMAGE_WRAPPERS = ("llava",)  # the wrappers whose images are served


def read_wrapper(folder: Path) -> dict[str, Any] | None:
    """A checkpoint folder's config.json dict; None for a file (a GGUF) or no config."""
    path = folder / "config.json"
    if not folder.is_dir() or not path.is_file():
        return None
    cfg: dict[str, Any] = json.loads(path.read_text())
    return cfg


def load_vision(folder: Path, dtype: torch.dtype, device: torch.device) -> VisionEncoder | None:
    """The encoder of the checkpoint in `folder` where its images are
    served; None where it has no vision part troupe reads; ModelLoadError for a missing or
    misshapen tensor."""
    wrapper = read_wrapper(folder)
    if wrapper is None or wrapper.get("model_type") not in IMAGE_WRAPPERS:
        return None
    try:
        vision = read_vision_config(wrapper)
    except ValueError as exc:
        raise ModelLoadError(f"{folder / 'config.json'}: {exc}") from exc
    if vision is None:
        return None
    encoder = VisionEncoder(vision, dtype, device)
    with contextlib.ExitStack() as stack:
        shards = open_shards(safetensors_files(folder), stack)
        names = [name for name in shards if is_vision_tensor(name)]
        try:
            encoder.load((name, shards[name].get_tensor(name)) for name in names)
        except ValueError as exc:
            raise ModelLoadError(f"{folder}: {exc}") from exc
    return encoder.eval()
