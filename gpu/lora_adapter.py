"""A LoRA adapter as PEFT saves it, read and checked against the model it is to run on.

    folder/adapter_config.json          r, lora_alpha, target_modules, use_rslora, ...
    folder/adapter_model.safetensors    base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight [r, in]
                                        base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight [out, r]
      (or adapter_model.bin)

A targeted projection computes W x + s B (A x), with s = lora_alpha / r (lora_alpha / sqrt(r)
with use_rslora); B is stored here already multiplied by s. What troupe does not run is refused
by name when the engine starts: DoRA, trained biases, modules_to_save, alpha_pattern, LoRA on
the embeddings or lm_head, a projection the model does not have, a rank past max_lora_rank.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from troupe.config_checks import ConfigError
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.rope_layers import order_heads

# PEFT's names of the projections troupe's layers hold (gpu/models.py fuses q/k/v and gate/up)
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION_MODULES + MLP_MODULES

Fail = Callable[[str], ConfigError]  # an error naming the adapter, for a message
_KEY = re.compile(
    r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight"
)


@dataclasses.dataclass(frozen=True)
class LoraAdapter:
    """One adapter's factors: (layer, module) -> (A [r, in], s * B [out, r]), fp32 on the CPU."""

    name: str
    path: str
    rank: int  # the largest of its modules' ranks
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each projection a LoRA module may target."""
    h = config.hidden_size
    inter = config.intermediate_size
    return {
        "q_proj": (config.q_size, h),
        "k_proj": (config.kv_size, h),
        "v_proj": (config.kv_size, h),
        "o_proj": (h, config.q_size),
        "gate_proj": (inter, h),
        "up_proj": (inter, h),
        "down_proj": (h, inter),
    }


def load_adapter(name: str, path: str, config: ModelConfig, max_rank: int) -> LoraAdapter:
    """Read and check the adapter at `path`; ConfigError naming the adapter and what is wrong."""
    folder = Path(path).expanduser()

    def fail(message: str) -> ConfigError:  # Fail
        return ConfigError(f"lora_modules: adapter {name!r} ({path}): {message}")

    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise fail("no adapter_config.json there (a PEFT adapter folder is expected)")
    try:
        settings = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise fail(f"adapter_config.json is not readable JSON: {exc}") from None
    scale_of = _scaling(settings, fail)
    tensors = _read_tensors(folder, fail)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.fullmatch(key)
        if match is None:
            raise fail(
                f"tensor {key!r} is not a LoRA factor of a decoder layer's projection "
                f"(troupe runs LoRA on {', '.join(TARGET_MODULES)})"
            )
        layer, module, which = int(match.group(1)), match.group(2), match.group(3)
        pairs.setdefault((layer, module), {})[which] = tensor
    if not pairs:
        raise fail("the adapter holds no LoRA weights")
    shapes = module_shapes(config)
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), factors in sorted(pairs.items()):
        where = f"layer {layer} {module}"
        if module not in shapes:
            raise fail(f"{where}: troupe runs LoRA on {', '.join(TARGET_MODULES)} only")
        if not 0 <= layer < config.num_layers:
            raise fail(f"{where}: the model has {config.num_layers} layers")
        if config.mla is not None or (config.is_sparse(layer) and module in MLP_MODULES):
            raise fail(f"{where}: LoRA on latent attention or MoE experts is not supported")
        if not config.gated_mlp and module in MLP_MODULES:
            raise fail(f"{where}: LoRA on {config.model_type}'s ungated MLP is not supported")
        if set(factors) != {"A", "B"}:
            raise fail(f"{where}: needs both lora_A and lora_B")
        a, b = factors["A"].float(), factors["B"].float()
        out_features, in_features = shapes[module]
        rank = a.shape[0]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise fail(
                f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit the "
                f"model's projection [{out_features}, {in_features}] (another base model's "
                "adapter?)"
            )
        if rank > max_rank:
            raise fail(f"{where}: rank {rank} is over max_lora_rank = {max_rank}")
        order = config.head_order  # q/k rows reordered as the model's (gpu/rope_layers.py)
        if order is not None and module in ("q_proj", "k_proj"):
            b = order_heads(b, order)
        weights[(layer, module)] = (a.contiguous(), (b * scale_of(rank)).contiguous())
    top = max(a.shape[0] for a, _ in weights.values())
    return LoraAdapter(name=name, path=str(folder), rank=top, weights=weights)


def _scaling(settings: dict[str, Any], fail: Fail) -> Callable[[int], float]:
    """The factor of B for a module of rank r, from adapter_config.json's settings."""
    if settings.get("peft_type", "LORA") != "LORA":
        raise fail(f"peft_type {settings.get('peft_type')!r} is not LORA")
    refused = (
        ("use_dora", "DoRA"),
        ("modules_to_save", "modules_to_save (fully trained copies of modules)"),
        ("alpha_pattern", "alpha_pattern"),
        ("fan_in_fan_out", "fan_in_fan_out (Conv1D models)"),
    )
    for key, what in refused:
        if settings.get(key):
            raise fail(f"{what} is not supported")
    if settings.get("bias", "none") != "none":
        raise fail(f"bias {settings['bias']!r} is not supported (only 'none')")
    alpha = settings.get("lora_alpha", settings.get("r", 8))
    if not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise fail(f"lora_alpha must be a number, got {alpha!r}")
    if settings.get("use_rslora"):
        return lambda rank: alpha / math.sqrt(rank)
    return lambda rank: alpha / rank


def _read_tensors(folder: Path, fail: Fail) -> dict[str, torch.Tensor]:
    safetensors_file = folder / "adapter_model.safetensors"
    bin_file = folder / "adapter_model.bin"
    try:
        if safetensors_file.is_file():
            from safetensors.torch import load_file

            return load_file(str(safetensors_file))
        if bin_file.is_file():
            loaded = torch.load(bin_file, map_location="cpu", weights_only=True)
            return {k: v for k, v in loaded.items() if isinstance(v, torch.Tensor)}
    except Exception as exc:  # a corrupt file: say which
        raise fail(f"its weights cannot be read: {exc}") from None
    raise fail("no adapter_model.safetensors or adapter_model.bin there")
