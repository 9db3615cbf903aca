"""The vision side of a LLaVA-style or Gemma 3 checkpoint, read from the wrapper's config.json.

    llava    a CLIP or SigLIP tower; the projector (linear, act, linear) reads the tower's
             hidden_states[vision_feature_layer] (no post_layernorm), hidden_states[0] being
             the embeddings (after CLIP's pre_layrnorm); "default" drops the first row, which
             is CLIP's class token (and, as transformers does, SigLIP's first patch), "full"
             keeps it; a list of feature layers concatenates their rows feature-wise
    gemma3   a SigLIP tower whose last state (after post_layernorm) is average-pooled to
             mm_tokens_per_image rows, RMS-normed Gemma's way and projected

Hub files leave out what transformers' config classes default, so those defaults fill them:
CLIPVisionConfig, SiglipVisionConfig, LlavaConfig, Gemma3Config and the text configs'
hidden_size. A wrapper of another model_type, or without a vision_config, reads as None.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F

TowerKind = Literal["clip", "siglip"]
ProjectorKind = Literal["llava", "gemma3"]

# transformers' ACT2FN names that CLIP/SigLIP towers and LLaVA projectors are seen with
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),  # the tanh formula in python
    "silu": F.silu,
    "relu": F.relu,
}
_TOWERS: dict[str, TowerKind] = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}
# CLIPVisionConfig's and SiglipVisionConfig's defaults (hub configs lean on several)
_TOWER_DEFAULTS: dict[TowerKind, dict[str, Any]] = {
    "clip": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
             "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 32,
             "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5},
    "siglip": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
               "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 16,
               "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6},
}  # fmt: skip
# the text config's hidden_size where it leaves it out (Llama/Mistral/Qwen2 4096, Gemma 3 2304)
_TEXT_HIDDEN = {"llama": 4096, "mistral": 4096, "qwen2": 4096, "gemma3_text": 2304}


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """A CLIP/SigLIP tower and the projector that turns its rows into text embeddings."""

    tower: TowerKind
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int
    layer_norm_eps: float
    hidden_act: str
    projector: ProjectorKind
    text_hidden_size: int
    image_token_index: int
    vision_feature_layer: int | tuple[int, ...] = -2  # llava's
    vision_feature_select_strategy: str = "default"  # llava's
    projector_hidden_act: str = "gelu"  # llava's
    multimodal_projector_bias: bool = True  # llava's
    mm_tokens_per_image: int = 256  # gemma3's

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"vision_config.num_attention_heads {self.num_heads} does not divide "
                f"hidden_size {self.hidden_size}"
            )
        if self.patches_per_side < 1:
            raise ValueError(f"vision_config.image_size {self.image_size} < patch_size")
        for field, act in (("hidden_act", self.hidden_act),
                           ("projector_hidden_act", self.projector_hidden_act)):  # fmt: skip
            if act not in ACTIVATIONS:
                raise ValueError(f"{field} {act!r}: handled are {sorted(ACTIVATIONS)}")
        if self.vision_feature_select_strategy not in ("default", "full"):
            raise ValueError(
                f"vision_feature_select_strategy {self.vision_feature_select_strategy!r}: "
                "handled are 'default' and 'full'"
            )
        layers = self.vision_feature_layer
        num_states = self.num_layers + 1  # hidden_states[0] is the embeddings
        if isinstance(layers, tuple) and not layers:
            raise ValueError("vision_feature_layer: an empty list")
        for index in layers if isinstance(layers, tuple) else (layers,):
            if not -num_states <= index < num_states:
                raise ValueError(
                    f"vision_feature_layer {index}: the tower has {num_states} hidden states"
                )
        side = round(self.mm_tokens_per_image**0.5)
        if self.projector == "gemma3" and (
            side * side != self.mm_tokens_per_image or self.patches_per_side % side
        ):
            raise ValueError(
                f"mm_tokens_per_image {self.mm_tokens_per_image}: not a square whose side "
                f"divides the {self.patches_per_side} patches a side"
            )

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side**2

    @property
    def num_positions(self) -> int:
        """Rows the tower carries: the patches, and CLIP's class token first."""
        return self.num_patches + (self.tower == "clip")

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The hidden_states indexes the projector reads, counted from 0 (the embeddings)."""
        if self.projector == "gemma3":
            return (self.num_layers,)
        layers = self.vision_feature_layer
        return tuple(i % (self.num_layers + 1) for i in (layers if isinstance(layers, tuple)
                                                          else (layers,)))  # fmt: skip

    @property
    def num_layers_run(self) -> int:
        """Encoder layers worth building: LLaVA stops at the deepest state it reads."""
        return max(self.feature_layers)

    @property
    def whole_image_attention(self) -> bool:
        """Whether the language model's rows of one image attend to each other, not only to
        those before them (Gemma 3's: transformers' token_type_ids mask)."""
        return self.projector == "gemma3"

    @property
    def tokens_per_image(self) -> int:
        """Rows one image gives the text model (its placeholder tokens)."""
        if self.projector == "gemma3":
            return self.mm_tokens_per_image
        return self.num_positions - (self.vision_feature_select_strategy == "default")


def read_vision_config(wrapper: dict[str, Any]) -> VisionConfig | None:
    """The vision side of a `llava` or `gemma3` config.json dict; None for any other."""
    projector = wrapper.get("model_type")
    vision = wrapper.get("vision_config")
    if projector not in ("llava", "gemma3") or not isinstance(vision, dict):
        return None
    tower_type = vision.get("model_type") or (
        "clip_vision_model" if projector == "llava" else "siglip_vision_model"
    )
    tower = _TOWERS.get(tower_type)
    if tower is None or (projector == "gemma3" and tower != "siglip"):
        handled = sorted(_TOWERS) if projector == "llava" else ["siglip_vision_model"]
        raise ValueError(f"vision_config.model_type {tower_type!r}: handled are {handled}")
    v = {**_TOWER_DEFAULTS[tower], **{k: x for k, x in vision.items() if x is not None}}
    layer = wrapper.get("vision_feature_layer", -2)
    strategy = wrapper.get("vision_feature_select_strategy", "default")
    if projector == "llava":
        token = wrapper.get("image_token_index", wrapper.get("image_token_id", 32000))
    else:
        token = wrapper.get("image_token_index", wrapper.get("image_token_id", 262_144))
    return VisionConfig(
        tower=tower,
        hidden_size=int(v["hidden_size"]),
        intermediate_size=int(v["intermediate_size"]),
        num_layers=int(v["num_hidden_layers"]),
        num_heads=int(v["num_attention_heads"]),
        image_size=_square(v["image_size"], "image_size"),
        patch_size=_square(v["patch_size"], "patch_size"),
        num_channels=int(v["num_channels"]),
        layer_norm_eps=float(v["layer_norm_eps"]),
        hidden_act=str(v["hidden_act"]),
        projector=projector,
        text_hidden_size=_text_hidden_size(wrapper),
        image_token_index=int(token),
        vision_feature_layer=tuple(map(int, layer)) if isinstance(layer, list) else int(layer),
        vision_feature_select_strategy=str(strategy),
        projector_hidden_act=str(wrapper.get("projector_hidden_act", "gelu")),
        multimodal_projector_bias=bool(wrapper.get("multimodal_projector_bias", True)),
        mm_tokens_per_image=int(wrapper.get("mm_tokens_per_image", 256)),
    )


def _square(value: Any, field: str) -> int:
    """An image or patch size, given as one int or as [height, width] of one value."""
    if isinstance(value, list | tuple):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"vision_config.{field} {value}: only square sizes are handled")
        value = value[0]
    return int(value)


def _text_hidden_size(wrapper: dict[str, Any]) -> int:
    text = wrapper.get("text_config") or {}
    if "hidden_size" in text:
        return int(text["hidden_size"])
    text_type = text.get("model_type") or (
        "llama" if wrapper["model_type"] == "llava" else "gemma3_text"
    )
    if text_type not in _TEXT_HIDDEN:
        raise ValueError(f"text_config.hidden_size: missing, and {text_type!r} has no default here")
    return _TEXT_HIDDEN[text_type]
