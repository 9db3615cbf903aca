"""The vision encoder of a multimodal checkpoint, loaded beside its text model when the engine
takes images (EngineConfig.limit_images_per_prompt > 0).

    config.json        the wrapper's vision_config and projector fields (gpu/vision_config.py)
    *.safetensors      only the vision tower's and projector's tensors are read here, by name
                       (gpu/text_part.py reads the text model's)

Which wrappers read images: LLaVA-1.5-style `llava` (a CLIP or SigLIP tower, an MLP
projector) and Gemma 3 (`gemma3`: SigLIP, pooled and normed rows), whose language model's
rows of one image attend to each other (VisionConfig.whole_image_attention: the scheduler
keeps an image in one chunk, the attention lifts those rows' causal edge). The other
wrappers are served text-only, their images refused where requests are tokenized.
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

IMAGE_WRAPPERS = ("llava", "gemma3")  # the wrappers whose images are served


def read_wrapper(folder: Path) -> dict[str, Any] | None:
    """A checkpoint folder's config.json dict; None for a file (a GGUF) or no config."""
    path = folder / "config.json"
    if not folder.is_dir() or not path.is_file():
        return None
    cfg: dict[str, Any] = json.loads(path.read_text())
    return cfg


def has_image_processor(folder: Path) -> bool:
    """Whether the folder says how its images are preprocessed (actors/core/image_prep.py
    reads it): preprocessor_config.json, or transformers 5's processor_config.json with an
    image_processor."""
    if (folder / "preprocessor_config.json").is_file():
        return True
    path = folder / "processor_config.json"
    return path.is_file() and "image_processor" in json.loads(path.read_text())


def load_vision(folder: Path, dtype: torch.dtype, device: torch.device) -> VisionEncoder | None:
    """The encoder of the checkpoint in `folder` where its images are
    served; None where it has no vision part troupe reads; ModelLoadError for a missing or
    misshapen tensor."""
    wrapper = read_wrapper(folder)
    if wrapper is None or wrapper.get("model_type") not in IMAGE_WRAPPERS:
        return None
    if not has_image_processor(folder):  # no way to make pixels: served text-only
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
