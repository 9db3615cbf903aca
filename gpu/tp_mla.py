"""DeepSeek-V2/V3 (latent attention, routed and shared experts) under tensor parallelism, cut as
vLLM's deepseek_v2 cuts it (H heads, P ranks, rank r holds heads [r*H/P, (r+1)*H/P)):

    q_a_proj, q_a_layernorm        whole on every rank (the q latent is per token, not per head)
    q_b_proj (or q_proj)           column-cut: the rank's heads' [q_nope | q_rope] rows
    kv_a_proj_with_mqa, kv_a_layernorm
                                   whole: every rank writes the same [c | k_r] row per token, so
                                   each rank keeps the full latent cache (as vLLM does)
    kv_b_proj                      column-cut: the rank's heads' [k_nope | v] rows; absorbed
                                   (W_uk, W_uv) or expanded (mla_expand_min_tokens) per rank
                                   over its heads, exactly as on one GPU
    o_proj                         row-cut: the rank's heads' columns; partial sums all-reduced

    dense layers (first_k_dense_replace)  the dense MLP cut (gpu/tp_model.py)
    routed experts                 each expert's rows cut, or whole experts per rank with
                                   expert parallelism (gpu/tp_moe.py; the router whole)
    shared experts                 cut like a dense MLP in both modes (gate/up rows, down
                                   columns); added to the routed partial sum before the one
                                   all-reduce after the experts (TPDecoderLayer.mlp)

The rank's MlaLayer is built from TPShard.layer_config (MlaConfig.num_heads = H/P); the
softmax scale and the rotary table depend on head dims only, so they are unchanged.
"""

from __future__ import annotations

import torch
from troupe.gpu.deepseek_moe import DeepseekMoe
from troupe.gpu.mla_layer import MlaLayer
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.tp_model import Target, TPDecoderLayer, TPShard
from troupe.gpu.tp_moe import moe_targets, rank_routing


class TPDeepseekMoe(DeepseekMoe):
    """DeepSeek's experts on one rank: its routed experts (or their rows) and its shared rows."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, *, shard: TPShard
    ) -> None:
        super().__init__(
            config,
            dtype,
            device,
            num_local_experts=shard.num_local_experts,
            shared_intermediate_size=shard.shared_intermediate_size,
        )
        self.rank_shard = shard

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rank_routing(super().route(x), self.rank_shard)


class TPMlaLayer(TPDecoderLayer, MlaLayer):
    """MlaLayer over the rank's heads; attention() and mlp() all-reduce (TPDecoderLayer)."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        layer_index: int,
        *,
        shard: TPShard,
    ) -> None:
        # a plain attribute, set before nn.Module's init: MlaLayer's init calls make_experts
        self.shard = shard
        super().__init__(config, dtype, device, layer_index)

    def make_experts(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device
    ) -> DeepseekMoe:
        return TPDeepseekMoe(config, dtype, device, shard=self.shard)


def mla_targets(
    layer: TPMlaLayer, prefix: str, shard: TPShard, *, fused: bool
) -> list[tuple[str, Target]]:
    """(checkpoint name, target) of the layer's attention and, on a sparse layer, its experts;
    `prefix` is 'model.layers.<i>.'; `fused`: the routed experts are stored fused."""
    m = shard.full.mla
    assert m is not None
    h0, nh = shard.first_head, shard.num_heads
    qk, kv = m.qk_nope_head_dim + m.qk_rope_head_dim, m.qk_nope_head_dim + m.v_head_dim
    a = prefix + "self_attn."
    o_proj = layer.o_proj
    assert isinstance(o_proj, torch.Tensor), "tensor-parallel shards are dense"
    targets: list[tuple[str, Target]] = [
        (a + "kv_a_proj_with_mqa.weight", (layer.kv_a_proj, None, 0, 0)),
        (a + "kv_a_layernorm.weight", (layer.kv_a_layernorm, None, 0, 0)),
        (a + "kv_b_proj.weight", (layer.kv_b_proj, 0, h0 * kv, (h0 + nh) * kv)),
        (a + "o_proj.weight", (o_proj, 1, h0 * m.v_head_dim, (h0 + nh) * m.v_head_dim)),
    ]
    if m.q_lora_rank:
        targets += [
            (a + "q_a_proj.weight", (layer.q_a_proj, None, 0, 0)),
            (a + "q_a_layernorm.weight", (layer.q_a_layernorm, None, 0, 0)),
            (a + "q_b_proj.weight", (layer.q_b_proj, 0, h0 * qk, (h0 + nh) * qk)),
        ]
    else:
        targets.append((a + "q_proj.weight", (layer.q_proj, 0, h0 * qk, (h0 + nh) * qk)))
    experts = layer.experts
    if experts is None:
        return targets  # dense: the caller's MLP targets
    targets += moe_targets(experts, prefix, shard, fused=fused)
    if experts.correction_bias is not None:
        bias = prefix + "mlp.gate.e_score_correction_bias"
        targets.append((bias, (experts.correction_bias, None, 0, 0)))
    gate_up, down = experts.shared_gate_up, experts.shared_down
    if gate_up is not None and down is not None:
        s = prefix + "mlp.shared_experts."
        ns = shard.shared_intermediate_size
        s0 = shard.rank * ns
        targets += [
            (s + "gate_proj.weight", (gate_up[:ns], 0, s0, s0 + ns)),
            (s + "up_proj.weight", (gate_up[ns:], 0, s0, s0 + ns)),
            (s + "down_proj.weight", (down, 1, s0, s0 + ns)),
        ]
    return targets
