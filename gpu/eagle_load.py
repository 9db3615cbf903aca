"""Loading an EAGLE-1 head (speculative_method="eagle", draft_model: the head's HF folder).

A head ships as EAGLE's checkpoints do: config.json (a one-layer Llama/Qwen config) and
safetensors or pytorch_model*.bin with, names optionally under `model.`:

    fc.weight [H, 2H] (fc.bias [H] when shipped)      layers.N.*: decoder layers (q/k/v/o,
    embed_tokens.weight [V, H]: else the model's      gate/up/down, post_attention_layernorm;
    norm.weight [H]: optional final norm              layer 0's input_layernorm optional)

lm_head.weight, when shipped, is ignored: logits come from the model's lm_head (as in vLLM).
Every refusal is a ConfigError naming draft_model (or the model's field) and both sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import torch
from troupe.config import ConfigError, EngineConfig
from troupe.gpu.draft_model import check_draft
from troupe.gpu.eagle_model import EagleHead
from troupe.gpu.final_hidden import FinalHidden
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, DecoderModel
from troupe.gpu.pool_sizing import block_bytes
from troupe.gpu.weights import iter_hf_tensors

HEAD_TYPES = ("llama", "mistral", "qwen2", "qwen3")
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
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
}


@dataclasses.dataclass(frozen=True)
class EagleModel:
    """A loaded EAGLE head, bound to its target (whose forward now fills final_hidden)."""

    config: ModelConfig  # the head's
    head: EagleHead
    final_hidden: FinalHidden

    def block_bytes(self, block_size: int, dtype: torch.dtype) -> int:
        """Bytes of one block of the head's pool: each target block id has one here too."""
        return block_bytes(self.config, block_size, dtype)


def check_eagle(target: ModelConfig, head: ModelConfig) -> None:
    """ConfigError when `head` cannot propose tokens for `target`."""
    if target.mla is not None or target.is_gemma3:
        raise ConfigError(
            f"speculative_method 'eagle' needs a Llama/Qwen-style model; the model's "
            f"model_type is {target.model_type!r}"
        )
    if head.model_type not in HEAD_TYPES or head.moe is not None:
        raise ConfigError(
            f"draft_model: an EAGLE head of model_type {head.model_type!r}; "
            f"expected one of {', '.join(HEAD_TYPES)} (dense layers)"
        )
    if head.hidden_size != target.hidden_size:
        raise ConfigError(
            f"draft_model has hidden_size {head.hidden_size}, the model has "
            f"{target.hidden_size}: an EAGLE-1 head reads the model's hidden states"
        )
    check_draft(target, head)  # the vocabulary, the window


def _head_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
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


def _destination(head: EagleHead, name: str) -> tuple[torch.Tensor, str] | None:
    """(where an HF-named tensor goes, its fill key); None: not the head's (lm_head, ...)."""
    c = head.config
    if name == "fc.weight":
        return head.fc, name
    if name == "fc.bias" and head.fc_bias is not None:
        return head.fc_bias, name
    if name == "embed_tokens.weight" and head.embed_tokens is not None:
        return head.embed_tokens, name
    if name == "norm.weight" and head.norm is not None:
        return head.norm, name
    parts = name.split(".")
    if len(parts) < 4 or parts[0] != "layers" or not parts[1].isdigit():
        return None
    if int(parts[1]) >= len(head.layers):
        return None
    layer = head.layers[int(parts[1])]
    assert isinstance(layer, DecoderLayer)
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
    whole = layer.qkv_bias if kind == "bias" else getattr(layer, param)
    if kind not in ("weight", "bias") or whole is None:
        return None
    return whole[start : start + sizes[part]], name


def load_eagle(
    config: EngineConfig,
    target_config: ModelConfig,
    target: DecoderModel,
    max_model_len: int,
    max_rows: int,
) -> EagleModel:
    """Read and check config.draft_model as an EAGLE head for `target`, load it, and have the
    target's forward keep every row's final hidden state (`max_rows` rows a step at most)."""
    assert config.draft_model is not None, "EngineConfig checks draft_model is set"
    folder = Path(config.draft_model).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"draft_model path {str(folder)!r} is not an EAGLE head's folder")
    head_config = ModelConfig.from_hf_folder(folder)
    check_eagle(target_config, head_config)
    tensors = dict(_head_tensors(folder))  # one read: the head is one layer (and an embedding)
    names = set(tensors)
    head = EagleHead(
        head_config,
        target,
        max_positions=max_model_len,
        fc_bias="fc.bias" in names,
        input_norm="layers.0.input_layernorm.weight" in names,
        final_norm="norm.weight" in names,
        own_embedding="embed_tokens.weight" in names,
    )
    filled = _fill(head, tensors)
    required = {k for k in _required(head) if k not in filled}
    if required:
        raise ConfigError(f"draft_model {str(folder)!r}: no tensor {sorted(required)[0]!r}")
    final = FinalHidden(max_rows, target_config.hidden_size, target.dtype, target.device)
    target.final_hidden = final  # before the runner captures the target's graphs
    return EagleModel(head_config, head.eval(), final)


@torch.inference_mode()
def _fill(head: EagleHead, tensors: dict[str, torch.Tensor]) -> set[str]:
    """Copy the checkpoint's tensors into the head: the fill keys it filled."""
    filled: set[str] = set()
    for name, tensor in tensors.items():
        found = _destination(head, name)
        if found is None:
            continue
        dest, key = found
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ConfigError(
                f"draft_model tensor {name!r} has shape {tuple(tensor.shape)}, the model "
                f"needs {tuple(dest.shape)} (hidden_size {head.config.hidden_size})"
            )
        dest.copy_(tensor)
        filled.add(key)
    return filled


def _required(head: EagleHead) -> list[str]:
    """The fill keys a head of this shape needs."""
    keys = ["fc.weight"]
    keys += [] if head.fc_bias is None else ["fc.bias"]
    keys += [] if head.norm is None else ["norm.weight"]
    keys += [] if head.embed_tokens is None else ["embed_tokens.weight"]
    for i, layer in enumerate(head.layers):
        assert isinstance(layer, DecoderLayer)
        names = [*_PLAIN, *(f"{m}.weight" for m in _FUSED)]
        if i == 0 and not head.has_input_norm:
            names.remove("input_layernorm.weight")
        if layer.q_norm is None:
            names = [n for n in names if "q_norm" not in n and "k_norm" not in n]
        if layer.qkv_bias is not None:
            names += [f"self_attn.{p}_proj.bias" for p in "qkv"]
        keys += [f"layers.{i}.{n}" for n in names]
    return keys
