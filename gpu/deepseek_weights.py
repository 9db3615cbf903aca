"""HF-named random weights of one DeepSeek layer (MLA and its MLP), for gpu/weights.random_weights.

Names as DeepSeek checkpoints write them: self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj},
kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; sparse layers mlp.gate.weight (and V3's
mlp.gate.e_score_correction_bias), mlp.experts.<e>.{gate,up,down}_proj, mlp.shared_experts.*.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from troupe.gpu.model_config import ModelConfig


def deepseek_layer_weights(
    config: ModelConfig,
    layer: int,
    matrix: Callable[..., torch.Tensor],
    norm: Callable[[int], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The layer's attention and MLP tensors (norms around them are the caller's)."""
    c, m = config, config.mla
    assert m is not None
    p = f"model.layers.{layer}."
    heads, h = m.num_heads, c.hidden_size
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    out: dict[str, torch.Tensor] = {}
    if m.q_lora_rank:
        out[p + "self_attn.q_a_proj.weight"] = matrix(m.q_lora_rank, h)
        out[p + "self_attn.q_a_layernorm.weight"] = norm(m.q_lora_rank)
        out[p + "self_attn.q_b_proj.weight"] = matrix(heads * qk, m.q_lora_rank)
    else:
        out[p + "self_attn.q_proj.weight"] = matrix(heads * qk, h)
    out[p + "self_attn.kv_a_proj_with_mqa.weight"] = matrix(m.latent_size, h)
    out[p + "self_attn.kv_a_layernorm.weight"] = norm(m.kv_lora_rank)
    out[p + "self_attn.kv_b_proj.weight"] = matrix(
        heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank
    )
    out[p + "self_attn.o_proj.weight"] = matrix(h, heads * m.v_head_dim)
    moe = c.moe
    mlps = [("mlp.", c.intermediate_size)]
    if moe is not None and c.is_sparse(layer):
        mlps = [(f"mlp.experts.{e}.", moe.intermediate_size) for e in range(moe.num_experts)]
        if moe.num_shared_experts:
            mlps.append(("mlp.shared_experts.", moe.num_shared_experts * moe.intermediate_size))
        out[p + "mlp.gate.weight"] = matrix(moe.num_experts, h)
        if moe.routing is not None and moe.routing.method == "noaux_tc":
            out[p + "mlp.gate.e_score_correction_bias"] = matrix(moe.num_experts).float()
    for mp, inter in mlps:
        out[p + mp + "gate_proj.weight"] = matrix(inter, h)
        out[p + mp + "up_proj.weight"] = matrix(inter, h)
        out[p + mp + "down_proj.weight"] = matrix(h, inter)
    return out
