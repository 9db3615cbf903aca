"""EAGLE-1 head folders for the tests, as EAGLE's checkpoints ship them (config.json of one
layer, safetensors named fc.weight, layers.0.*, optional embed_tokens / norm)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def target_tensors(target: Path) -> dict[str, torch.Tensor]:
    """The target folder's tensors (HF names)."""
    return load_file(str(target / "model.safetensors"))


def save_head(
    folder: Path, target: Path, tensors: dict[str, torch.Tensor], **config: object
) -> Path:
    """A head folder: the target's config.json with one layer (and `config` over it)."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((target / "config.json").read_text())
    cfg.update({"num_hidden_layers": 1, **config})
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def copy_head(folder: Path, target: Path) -> Path:
    """The head that reproduces a one-layer target: fc = [I, 0] takes the token's embedding,
    the layer is the target's layer 0 with its input norm, the final norm the target's. A
    row at position p then computes what the target computes at p + 1, but for attention
    that misses the sequence's first token (the head has no row for it)."""
    weights = target_tensors(target)
    hidden = weights["model.embed_tokens.weight"].shape[1]
    tensors = {
        "fc.weight": torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1),
        "norm.weight": weights["model.norm.weight"],
    }
    for name, tensor in weights.items():
        if name.startswith("model.layers.0."):
            tensors[name.removeprefix("model.")] = tensor
    return save_head(folder, target, tensors)


def random_head(
    folder: Path, target: Path, seed: int = 3, *, fc_bias: bool = False, embed: bool = False
) -> Path:
    """An untrained EAGLE-1 head: random fc and layer, no layer-0 input norm, no final norm,
    the target's embedding unless `embed`."""
    g = torch.Generator().manual_seed(seed)
    weights = target_tensors(target)
    hidden = weights["model.embed_tokens.weight"].shape[1]
    tensors = {"fc.weight": torch.randn(hidden, 2 * hidden, generator=g) * 0.1}
    if fc_bias:
        tensors["fc.bias"] = torch.randn(hidden, generator=g) * 0.1
    if embed:
        tensors["embed_tokens.weight"] = torch.randn(
            *weights["model.embed_tokens.weight"].shape, generator=g
        )
    for name, tensor in weights.items():
        if name.startswith("model.layers.0.") and "input_layernorm" not in name:
            scale = 1.0 if "norm" in name else 0.2
            noise = torch.randn(*tensor.shape, generator=g) * scale
            tensors[name.removeprefix("model.")] = 1.0 + 0.1 * noise if "norm" in name else noise
    return save_head(folder, target, tensors)
