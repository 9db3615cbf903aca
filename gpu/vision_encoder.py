"""Images to the rows that replace their placeholder tokens' embeddings: a CLIP/SigLIP tower
and a LLaVA or Gemma 3 projector (gpu/vision_tower.py, gpu/vision_projector.py), computing
what transformers' `get_image_features` does.

    pixels [N, C, S, S] -> tower -> projector -> [N, tokens_per_image, text hidden size]

Tensor names, as checkpoints hold them:

    vision_tower.vision_model.<x>           hub files saved by transformers 4
    model.vision_tower.vision_model.<x>     transformers 4.5x's own names
    vision_tower.<x>, model.vision_tower.<x>  transformers 5 (it saves the first)
    multi_modal_projector.<y>, model.multi_modal_projector.<y>

all read as the encoder's `vision_tower.<x>` / `multi_modal_projector.<y>`. Tensors of the
tower that no projector reads are skipped: SigLIP's pooling head (head.*), layers past the
deepest state LLaVA reads, LLaVA's unused post_layernorm, and old CLIP files' position_ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn
from troupe.gpu.vision_config import VisionConfig
from troupe.gpu.vision_projector import make_projector
from troupe.gpu.vision_tower import VisionTower

_TOWER = ("vision_tower.vision_model.", "vision_tower.")
_PROJECTOR = "multi_modal_projector."
_LAYER = re.compile(r"vision_tower\.encoder\.layers\.(\d+)\.")


def is_vision_tensor(name: str) -> bool:
    """Whether a checkpoint tensor belongs to the vision tower or the projector (SigLIP's
    pooling head included, which VisionEncoder.load skips)."""
    return name.removeprefix("model.").startswith(("vision_tower.", _PROJECTOR))


def _encoder_name(name: str) -> str | None:
    """A checkpoint name in the encoder's terms (module docstring); None for another part's."""
    name = name.removeprefix("model.")
    for prefix in _TOWER:
        if name.startswith(prefix):
            return "vision_tower." + name.removeprefix(prefix)
    return name if name.startswith(_PROJECTOR) else None


class VisionEncoder(nn.Module):
    """A multimodal checkpoint's tower and projector, in `dtype` on `device`."""

    def __init__(self, config: VisionConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.device = device
        self.vision_tower = VisionTower(config, dtype, device)
        self.multi_modal_projector = make_projector(config, dtype, device)

    @property
    def tokens_per_image(self) -> int:
        return self.config.tokens_per_image

    @torch.no_grad()
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, C, S, S] of any float dtype -> [N, tokens_per_image, text hidden] in
        the encoder's dtype."""
        states = self.vision_tower(pixels.to(self.device, self.dtype))
        rows: torch.Tensor = self.multi_modal_projector(states)
        return rows.to(self.dtype)

    def load(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Fill every parameter from the checkpoint's vision tensors (HF names); a missing
        tensor, a wrong shape or a name the encoder does not know is refused by name."""
        params = dict(self.named_parameters())
        filled: set[str] = set()
        for name, tensor in tensors:
            local = _encoder_name(name)
            if local is None:
                raise ValueError(f"{name}: not a vision tensor (is_vision_tensor says which are)")
            param = params.get(local)
            if param is None:
                if self._unused(local):
                    continue
                raise ValueError(f"{name}: no such tensor in a {self._kind()} encoder")
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(
                    f"{name}: shape {list(tensor.shape)}, the config makes it {list(param.shape)}"
                )
            with torch.no_grad():
                param.copy_(tensor)
            filled.add(local)
        missing = sorted(set(params) - filled)
        if missing:
            raise ValueError(f"missing vision tensors: {', '.join(missing)}")

    def _unused(self, local: str) -> bool:
        """A tensor of the tower that no projector reads (module docstring)."""
        if local.startswith(("vision_tower.head.", "vision_tower.post_layernorm.")):
            return True  # post_layernorm is a parameter when Gemma 3 reads it
        if local.endswith("position_ids"):
            return True
        layer = _LAYER.match(local)
        return layer is not None and (
            self.config.num_layers_run <= int(layer.group(1)) < self.config.num_layers
        )

    def _kind(self) -> str:
        return f"{self.config.tower}/{self.config.projector}"
