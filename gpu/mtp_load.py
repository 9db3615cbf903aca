"""Loading DeepSeek's multi-token-prediction layer (speculative_method "mtp", vLLM's
"deepseek_mtp") from the model's own HF folder: no draft_model.

A DeepSeek-V3 checkpoint whose config.json declares num_nextn_predict_layers >= 1 ships, for
L = num_hidden_layers, the tensors of layer L (names under `model.layers.{L}.`):

    enorm.weight, hnorm.weight [H]        eh_proj.weight [H, 2H]
    shared_head.norm.weight [H]           shared_head.head.weight [V, H]  (optional)
    embed_tokens.weight [V, H] (optional) a decoder layer: input/post_attention_layernorm,
                                          self_attn.* (MLA), mlp.* (dense or experts, as
                                          layer L of the model would be: first_k_dense_replace,
                                          moe_layer_freq)

Only the files holding them are opened (the index's weight_map); fp8 tensors with their
scales are expanded to the model's dtype. A shipped embed_tokens or shared_head.head equal to
the model's own (DeepSeek-V3 ships copies of both) is not kept twice: the head uses the
model's. Refused with a ConfigError naming the field or tensor: a model that is not an HF
DeepSeek folder, no num_nextn_predict_layers, more than one MTP layer, a missing tensor, a
tensor of another shape. Tensor parallelism is refused by EngineConfig (config_checks.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from troupe.config import ConfigError
from troupe.gpu.deepseek_config import DEEPSEEK_TYPES, deepseek_fields
from troupe.gpu.deepseek_weights import deepseek_layer_weights
from troupe.gpu.eagle_load import FINAL_STATE, EagleModel
from troupe.gpu.fp8_weights import expand_fp8_dict
from troupe.gpu.head_weights import layer_destination
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderModel
from troupe.gpu.mtp_model import MtpHead
from troupe.gpu.target_hidden import TargetHidden
from troupe.gpu.weights import INDEX_FILE, safetensors_files

METHOD = "speculative_method 'mtp'"
_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")


def mtp_config(raw: dict[str, Any], target: ModelConfig) -> ModelConfig:
    """The MTP layer's ModelConfig: the model's, one layer, with experts when layer L of the
    model would have them."""
    num_layers = target.num_layers
    _, moe = deepseek_fields(raw, num_layers + 1)
    if moe is not None:
        moe = dataclasses.replace(moe, sparse_layers=(moe.sparse_layers[num_layers],))
    return dataclasses.replace(target, num_layers=1, moe=moe, num_mtp_layers=0)


def check_mtp_model(folder: Path, target: ModelConfig) -> dict[str, Any]:
    """The model's config.json when it ships one MTP layer troupe can run; else ConfigError."""
    if not folder.is_dir():
        raise ConfigError(
            f"{METHOD} reads the MTP layer from the model's HF folder; model {str(folder)!r} "
            "is not one"
        )
    if target.mla is None or target.model_type not in DEEPSEEK_TYPES:
        raise ConfigError(
            f"{METHOD} needs a DeepSeek-V3-style model (model_type one of "
            f"{', '.join(DEEPSEEK_TYPES)}); the model's model_type is {target.model_type!r}"
        )
    raw: dict[str, Any] = json.loads((folder / "config.json").read_text())
    count = raw.get("num_nextn_predict_layers")
    if not isinstance(count, int) or count < 1:
        raise ConfigError(
            f"{METHOD}: the model's config.json has num_nextn_predict_layers {count!r}; "
            "it needs >= 1 (a checkpoint with a multi-token-prediction layer)"
        )
    if count > 1:
        raise ConfigError(
            f"{METHOD}: the model's config.json has num_nextn_predict_layers {count}; "
            "troupe runs one MTP layer (1)"
        )
    return raw


def read_layer(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors named `prefix`* (the prefix taken off), from the files that hold them;
    fp8 weights expanded with their scales, the scales dropped."""
    from safetensors import safe_open

    files = safetensors_files(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        wanted = {folder / f for name, f in weight_map.items() if name.startswith(prefix)}
        files = [f for f in files if f in wanted]
    found: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if name.startswith(prefix):
                    found[name.removeprefix(prefix)] = handle.get_tensor(name)
    return expand_fp8_dict(found)


def _required(config: ModelConfig) -> list[str]:
    """The layer-relative names the MTP layer cannot do without (DeepSeek's layout)."""
    empty = torch.empty(0, device="meta")
    layer = deepseek_layer_weights(config, 0, lambda *_: empty, lambda _: empty)
    norms = ["input_layernorm.weight", "post_attention_layernorm.weight"]
    return [*_OWN, *norms, *(n.removeprefix("model.layers.0.") for n in layer)]


def _same(shipped: torch.Tensor, own: object) -> bool:
    """Whether a shipped embedding or head is the model's own (then shared, not copied)."""
    if not isinstance(own, torch.Tensor) or tuple(own.shape) != tuple(shipped.shape):
        return False
    return bool(torch.equal(shipped.to(own.device, own.dtype), own))


def load_mtp(
    folder: Path, target_config: ModelConfig, target: DecoderModel, max_rows: int
) -> EagleModel:
    """Read and check the model's MTP layer, load it as a draft head, and have the model's
    forward keep every row's post-norm state (`max_rows` rows a step at most)."""
    raw = check_mtp_model(folder, target_config)
    config = mtp_config(raw, target_config)
    prefix = f"model.layers.{target_config.num_layers}."
    tensors = read_layer(folder, prefix)
    for name in _required(config):
        if name not in tensors:
            raise ConfigError(f"{METHOD}: the model has no MTP tensor {prefix + name!r}")
    own_logits = target.embed_tokens if target.lm_head is None else target.lm_head
    embed = tensors.get("embed_tokens.weight")
    head_weight = tensors.get("shared_head.head.weight")
    head = MtpHead(
        config,
        target,
        own_embedding=embed is not None and not _same(embed, target.embed_tokens),
        own_head=head_weight is not None and not _same(head_weight, own_logits),
    )
    _fill(head, tensors, prefix)
    hidden = TargetHidden(
        FINAL_STATE, max_rows, target_config.hidden_size, target.dtype, target.device
    )
    target.target_hidden = hidden  # before the runner captures the model's graphs
    return EagleModel(config, head, hidden)


@torch.inference_mode()
def _fill(head: MtpHead, tensors: dict[str, torch.Tensor], prefix: str) -> None:
    """Copy each tensor to its place in the head, its shape checked (ConfigError)."""
    own: dict[str, torch.Tensor | None] = {
        "enorm.weight": head.enorm,
        "hnorm.weight": head.hnorm,
        "eh_proj.weight": head.eh_proj,
        "shared_head.norm.weight": head.shared_norm,
        "shared_head.head.weight": head.shared_head,
        "embed_tokens.weight": head.embed_tokens,
    }
    layer = head.layer
    for name, tensor in tensors.items():
        dest: torch.Tensor | None
        if name in own:
            dest = own[name]
        elif (extra := layer.locate_extra(name, "layers.0")) is not None:
            dest = extra[0]  # MLA projections, experts
        else:
            found = layer_destination([layer], f"layers.0.{name}")
            dest = None if found is None else found[0]  # norms, o_proj, a dense MLP
        if dest is None:
            continue  # a shared copy of the model's weights, rotary_emb.inv_freq, ...
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ConfigError(
                f"{METHOD}: the model's tensor {prefix + name!r} has shape "
                f"{tuple(tensor.shape)}, the MTP layer needs {tuple(dest.shape)}"
            )
        dest.copy_(tensor)
