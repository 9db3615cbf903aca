"""EAGLE-3 head folders for the tests, as EAGLE-3 checkpoints ship them (config.json with
draft_vocab_size, target_hidden_size T for a head of another width; fc.weight [H, 3T],
midlayer.* with q/k/v over 2H and hidden_norm, norm.weight, lm_head.weight [Vd, H], d2t and
t2d)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.gpu.eagle_heads import save_head, target_tensors

ARCH = {"architectures": ["LlamaForCausalLMEagle3"]}


def draft_ids(vocab: int, draft_vocab: int, seed: int = 0) -> torch.Tensor:
    """A draft vocabulary: `draft_vocab` target ids, ascending, always with ids 0..7."""
    g = torch.Generator().manual_seed(seed)
    rest = torch.randperm(vocab - 8, generator=g)[: draft_vocab - 8] + 8
    return torch.cat([torch.arange(8), rest]).sort().values


def random_head3(
    folder: Path,
    target: Path,
    seed: int = 3,
    *,
    draft_vocab: int | None = None,
    num_taps: int = 3,
    embed: bool = False,
    hidden_size: int | None = None,
    **config: Any,
) -> Path:
    """An untrained EAGLE-3 head (one layer, `midlayer.*`); a draft vocabulary of
    `draft_vocab` ids (d2t, t2d) when given, else the full vocabulary without d2t. With
    `hidden_size` (not the target's) the head is that wide, with target_hidden_size, an MLP
    twice as wide and the head_dim of its config (the target's or hidden_size // heads)."""
    g = torch.Generator().manual_seed(seed)
    cfg = json.loads((target / "config.json").read_text())
    t, vocab = cfg["hidden_size"], cfg["vocab_size"]
    h = hidden_size or t
    if h != t:
        config = {"hidden_size": h, "target_hidden_size": t, "intermediate_size": 2 * h, **config}
    cfg.update(config)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or h // heads
    shapes = {  # the q/k norms and q/k/v biases a layer of the family may have
        "self_attn.q_norm.weight": (head_dim,),
        "self_attn.k_norm.weight": (head_dim,),
        "self_attn.q_proj.bias": (heads * head_dim,),
        "self_attn.k_proj.bias": (kv_heads * head_dim,),
        "self_attn.v_proj.bias": (kv_heads * head_dim,),
    }

    def randn(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    tensors = {
        "fc.weight": randn(h, num_taps * t, scale=0.1),
        "norm.weight": 1.0 + randn(h, scale=0.1),
        "midlayer.hidden_norm.weight": 1.0 + randn(h, scale=0.1),
        "midlayer.input_layernorm.weight": 1.0 + randn(h, scale=0.1),
        "midlayer.post_attention_layernorm.weight": 1.0 + randn(h, scale=0.1),
        "midlayer.self_attn.q_proj.weight": randn(heads * head_dim, 2 * h),
        "midlayer.self_attn.k_proj.weight": randn(kv_heads * head_dim, 2 * h),
        "midlayer.self_attn.v_proj.weight": randn(kv_heads * head_dim, 2 * h),
        "midlayer.self_attn.o_proj.weight": randn(h, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": randn(cfg["intermediate_size"], h),
        "midlayer.mlp.up_proj.weight": randn(cfg["intermediate_size"], h),
        "midlayer.mlp.down_proj.weight": randn(h, cfg["intermediate_size"]),
    }
    weights = target_tensors(target)
    for name, tensor in weights.items():  # q/k norms and q/k/v biases of the family
        rest = name.removeprefix("model.layers.0.")
        if rest in shapes:  # the target's, shaken; fresh where the head's shape differs
            base = tensor if tensor.shape == shapes[rest] else torch.ones(shapes[rest])
            tensors["midlayer." + rest] = base + 0.1 * randn(*shapes[rest])
    if embed:
        tensors["embed_tokens.weight"] = randn(vocab, h, scale=1.0)
    draft_vocab = draft_vocab or vocab
    tensors["lm_head.weight"] = randn(draft_vocab, h, scale=1.0)
    if draft_vocab < vocab:
        ids = draft_ids(vocab, draft_vocab, seed)
        tensors["d2t"] = ids - torch.arange(draft_vocab)
        tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)
    return save_head(folder, target, tensors, draft_vocab_size=draft_vocab, **ARCH, **config)


def unit_rms_embeddings(hf_model: Any) -> None:
    """Every embedding row scaled to RMS 1, so an RMSNorm of a row is linear in it."""
    with torch.no_grad():
        rows = hf_model.model.embed_tokens.weight.double()
        rows /= rows.pow(2).mean(-1, keepdim=True).sqrt()
        hf_model.model.embed_tokens.weight.copy_(rows.float())


def copy_head3(folder: Path, target: Path, amplitude: float = 40.0) -> Path:
    """The EAGLE-3 head that reproduces a one-layer, windowed Qwen2 target whose embedding
    rows have RMS 1 and whose KV heads span the hidden size (num_kv_heads * head_dim = H).

    An EAGLE-3 head's residual stream starts from its hidden input, not from the token's
    embedding, so a one-layer head cannot carry the embedding the target's layer adds back.
    Two layers can: layer 0 rebuilds the embedding, layer 1 is the target's layer.
      layer 0: q and k only a bias on RoPE's fastest pair (theta 1 rad), so a row's score
               with itself beats the others of the window by >= 180: softmax one-hot in
               fp32; v = the normed embedding (input norm ones, RMS 1: linear), o = I;
               MLP down = 0; hidden_norm = 0 with norm_before_residual: the residual stream
               starts at 0 whatever hidden it is fed (so the target's states are unused).
      layer 1: the target's layer 0, then its norm and lm_head (tied: the embedding).
    A row at p then computes the target's row at p + 1 but for attention that misses the
    sequence's first token, as the EAGLE-1 copy head (tests/gpu/eagle_heads.py)."""
    cfg = json.loads((target / "config.json").read_text())
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = h // heads
    assert cfg["num_key_value_heads"] == heads and cfg["num_hidden_layers"] == 1
    weights = target_tensors(target)
    eps = cfg["rms_norm_eps"]
    bias = torch.zeros(heads, head_dim)
    bias[:, 0] = amplitude
    zeros = torch.zeros
    tensors = {
        "fc.weight": zeros(h, 2 * h),
        "norm.weight": weights["model.norm.weight"],
        "lm_head.weight": weights["model.embed_tokens.weight"],
        "midlayer.hidden_norm.weight": zeros(h),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": zeros(h, 2 * h),
        "midlayer.self_attn.k_proj.weight": zeros(h, 2 * h),
        "midlayer.self_attn.v_proj.weight": torch.cat(
            [torch.eye(h) * (1.0 + eps) ** 0.5, zeros(h, h)], dim=1
        ),
        "midlayer.self_attn.q_proj.bias": bias.flatten(),
        "midlayer.self_attn.k_proj.bias": bias.flatten().clone(),
        "midlayer.self_attn.v_proj.bias": zeros(h),
        "midlayer.self_attn.o_proj.weight": torch.eye(h),
        "midlayer.mlp.gate_proj.weight": zeros(cfg["intermediate_size"], h),
        "midlayer.mlp.up_proj.weight": zeros(cfg["intermediate_size"], h),
        "midlayer.mlp.down_proj.weight": zeros(h, cfg["intermediate_size"]),
    }
    for name, tensor in weights.items():
        if name.startswith("model.layers.0."):
            tensors["layers.1." + name.removeprefix("model.layers.0.")] = tensor
    return save_head(
        folder,
        target,
        tensors,
        num_hidden_layers=2,
        layer_types=cfg.get("layer_types", ["sliding_attention"]) * 2,
        draft_vocab_size=cfg["vocab_size"],
        eagle_aux_hidden_state_layer_ids=[0, 1],
        norm_before_residual=True,
        **ARCH,
    )
