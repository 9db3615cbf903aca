"""Reading an EAGLE head's checkpoint into our decoder layers (gpu/eagle_load.py for EAGLE-1,
gpu/eagle3_load.py for EAGLE-3): the tensors of a folder, where a layer's HF-named tensor
goes (q/k/v and gate/up into the fused projections), the copy with its shape checked, and
the layer tensors a head of a given shape cannot do without."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from troupe.config import ConfigError
from troupe.gpu.models import DecoderLayer
from troupe.gpu.weights import iter_hf_tensors

_FUSED = {  # HF name in a layer -> (our parameter, which slice)
    "self_attn.q_proj": ("qkv_proj", 0),
    "self_attn.k_proj": ("qkv_proj", 1),
    "self_attn.v_proj": ("qkv_proj", 2),
    "mlp.gate_proj": ("gate_up_proj", 0),
    "mlp.up_proj": ("gate_up_proj", 1),
}
_PLAIN = {
    "input_layernorm.weight": "input_layernorm",
    "post_attention_layernorm.weight": "post_attention_layernorm",
    "self_attn.o_proj.weight": "o_proj",
    "mlp.down_proj.weight": "down_proj",
    "self_attn.o_proj.bias": "o_bias",
    "mlp.down_proj.bias": "down_bias",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
}
Destination = tuple[torch.Tensor, str]  # (where a tensor goes, its fill key)


def head_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name without `model.`, tensor) from safetensors, else from pytorch_model*.bin."""
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if any(folder.glob("*.safetensors")) or not bins:
        tensors: Iterator[tuple[str, torch.Tensor]] = iter_hf_tensors(folder)
    else:
        tensors = (
            item
            for file in bins
            for item in torch.load(file, map_location="cpu", weights_only=True).items()
        )
    for name, tensor in tensors:
        yield name.removeprefix("model."), tensor


def layer_destination(layers: Sequence[DecoderLayer], name: str) -> Destination | None:
    """Where a `layers.N.*` tensor goes; None: not one of the layers' (or another name)."""
    parts = name.split(".")
    if len(parts) < 4 or parts[0] != "layers" or not parts[1].isdigit():
        return None
    if int(parts[1]) >= len(layers):
        return None
    layer = layers[int(parts[1])]
    c = layer.config
    rest = ".".join(parts[2:])
    if rest in _PLAIN:
        found: torch.Tensor | None = getattr(layer, _PLAIN[rest])
        return None if found is None else (found, name)
    module, kind = rest.rsplit(".", 1)
    if module not in _FUSED:
        return None
    param, part = _FUSED[module]
    sizes = (c.q_size, c.kv_size, c.kv_size) if param == "qkv_proj" else (c.intermediate_size,) * 2
    start = sum(sizes[:part])
    whole = getattr(layer, param.replace("_proj", "_bias") if kind == "bias" else param)
    if kind not in ("weight", "bias") or whole is None:
        return None
    return whole[start : start + sizes[part]], name


def layer_keys(layers: Sequence[DecoderLayer], *, first_input_norm: bool = True) -> list[str]:
    """The fill keys of the layers' tensors; layer 0's input norm only if `first_input_norm`."""
    keys: list[str] = []
    for i, layer in enumerate(layers):
        names = [*_PLAIN, *(f"{m}.weight" for m in _FUSED)]
        if i == 0 and not first_input_norm:
            names.remove("input_layernorm.weight")
        if layer.q_norm is None:
            names = [n for n in names if "q_norm" not in n and "k_norm" not in n]
        names = [n for n in names if not n.endswith(".bias")]  # the biases it has: below
        if layer.qkv_bias is not None:
            names += [f"self_attn.{p}_proj.bias" for p in "qkv"]
        if layer.o_bias is not None:
            names.append("self_attn.o_proj.bias")
        if layer.gate_up_bias is not None:
            names += [f"mlp.{p}_proj.bias" for p in ("gate", "up", "down")]
        keys += [f"layers.{i}.{n}" for n in names]
    return keys


@torch.inference_mode()
def fill(
    tensors: dict[str, torch.Tensor], destination: dict[str, Destination | None], hidden_size: int
) -> set[str]:
    """Copy each tensor to its destination (None: not the head's): the fill keys filled."""
    filled: set[str] = set()
    for name, tensor in tensors.items():
        found = destination.get(name)
        if found is None:
            continue
        dest, key = found
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ConfigError(
                f"draft_model tensor {name!r} has shape {tuple(tensor.shape)}, the model "
                f"needs {tuple(dest.shape)} (hidden_size {hidden_size})"
            )
        dest.copy_(tensor)
        filled.add(key)
    return filled


def check_filled(folder: Path, required: list[str], filled: set[str]) -> None:
    """ConfigError naming the first required tensor the checkpoint lacks."""
    missing = sorted(k for k in required if k not in filled)
    if missing:
        raise ConfigError(f"draft_model {str(folder)!r}: no tensor {missing[0]!r}")
