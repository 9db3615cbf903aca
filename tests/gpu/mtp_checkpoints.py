"""Tiny DeepSeek-V3 HF folders with a multi-token-prediction layer, for the MTP tests: the
model's random weights (gpu/weights.random_weights) plus layer L = num_hidden_layers under
DeepSeek's names (enorm, hnorm, eh_proj, shared_head.*, a decoder layer), random or built
to reproduce the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from troupe.gpu.deepseek_weights import deepseek_layer_weights
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import random_weights

from tests.gpu.conftest import add_word_tokenizer

CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "q_lora_rank": 24,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 96,  # the dense first layer
    "first_k_dense_replace": 1,  # layer 0 dense; layer 1 and the MTP layer (2) experts
    "n_group": 4,
    "topk_group": 2,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000.0,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
}


def hf_config(**overrides: Any) -> Any:
    import transformers

    return transformers.DeepseekV3Config(**{**CONFIG, **overrides})


def mtp_tensors(
    folder: Path, seed: int, std: float = 0.2, *, own_head: bool = True
) -> dict[str, torch.Tensor]:
    """A random MTP layer for the model of `folder`'s config.json (L: its num_hidden_layers;
    experts as layer L would have them), under checkpoint names."""
    raw = json.loads((folder / "config.json").read_text())
    num_layers = raw["num_hidden_layers"]
    wider = ModelConfig.from_hf_dict({**raw, "num_hidden_layers": num_layers + 1})
    gen = torch.Generator().manual_seed(seed)
    h, v = wider.hidden_size, wider.vocab_size

    def matrix(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    def norm(size: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(size, generator=gen)

    p = f"model.layers.{num_layers}."
    out = deepseek_layer_weights(wider, num_layers, matrix, norm)
    for name in ("input_layernorm", "post_attention_layernorm", "enorm", "hnorm"):
        out[f"{p}{name}.weight"] = norm(h)
    out[p + "shared_head.norm.weight"] = norm(h)
    out[p + "eh_proj.weight"] = matrix(h, 2 * h)
    if own_head:
        out[p + "shared_head.head.weight"] = matrix(v, h)
    return out


def save_model(
    folder: Path,
    tensors: dict[str, torch.Tensor] | None = None,
    *,
    seed: int = 3,
    mtp_seed: int | None = 11,
    **overrides: Any,
) -> Path:
    """A DeepSeek-V3 folder: random model weights (or `tensors`), a random MTP layer unless
    mtp_seed is None, a word tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    hf_config(**overrides).save_pretrained(folder)
    config = ModelConfig.from_hf_folder(folder)
    if tensors is None:
        tensors = random_weights(config, torch.float32, seed=seed, std=0.2)
        if mtp_seed is not None:
            tensors.update(mtp_tensors(folder, mtp_seed))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    add_word_tokenizer(folder)
    return folder


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def bigram_copy(folder: Path) -> Path:
    """A one-layer model whose attention adds nothing (o_proj = 0: its next token is a
    function of the current one) with embedding rows of RMS 1, and the MTP layer that
    reproduces it: the model's own layer (experts and all), eh_proj = [I | 0] so that the
    layer reads enorm(embed(token)) = the embedding, shared_head.norm = the model's norm,
    shared_head.head and embed_tokens copies of the model's (so shared, not kept twice).
    The row at position p then computes what the model computes at p + 1 (position 0, whose
    embedding vLLM masks, is never drawn from for prompts of two tokens or more)."""
    overrides = {"num_hidden_layers": 1, "first_k_dense_replace": 0}
    base = save_model(folder, mtp_seed=None, **overrides)
    tensors = tensors_of(base)
    embed = tensors["model.embed_tokens.weight"]
    tensors["model.embed_tokens.weight"] = embed / embed.pow(2).mean(-1, keepdim=True).sqrt()
    tensors["model.layers.0.self_attn.o_proj.weight"].zero_()
    h = embed.shape[1]
    for name, tensor in list(tensors.items()):
        if name.startswith("model.layers.0."):
            tensors[name.replace("model.layers.0.", "model.layers.1.")] = tensor.clone()
    p = "model.layers.1."
    tensors[p + "enorm.weight"] = torch.ones(h)
    tensors[p + "hnorm.weight"] = torch.ones(h)
    tensors[p + "eh_proj.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
    tensors[p + "shared_head.norm.weight"] = tensors["model.norm.weight"].clone()
    tensors[p + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    tensors[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    return save_model(folder, tensors, **overrides)
