"""MiniMax-M2's decoder layer (transformers' MiniMaxM2DecoderLayer): the pre-norm layer with
OLMo's q / k norms across all heads before the rotary (gpu/olmo2_layer.WholeWidthQkNorm; the
partial rotary, `rotary_dim` of each head, is ModelConfig's, and the loader puts the norms'
weights in the heads' rotary order as it does q and k), and DeepSeek-V3's routed experts in
every layer (gpu/grouped_moe_layer.py): sigmoid scores, the top-k picked with the correction
bias and renormalised, the router in fp32, no shared experts.

Its checkpoints name the MoE as Mixtral's, the correction bias beside the router:

    block_sparse_moe.gate.weight                 -> mlp.gate.weight
    block_sparse_moe.e_score_correction_bias     -> mlp.gate.e_score_correction_bias
    block_sparse_moe.experts.<e>.w1 | w3 | w2    -> mlp.experts.<e>.gate_proj | up_proj | down_proj
"""

from __future__ import annotations

import torch
from troupe.gpu.grouped_moe_layer import GroupedMoeLayer
from troupe.gpu.moe_layer import mixtral_name
from troupe.gpu.olmo2_layer import WholeWidthQkNorm

_BIAS = {"block_sparse_moe.e_score_correction_bias": "mlp.gate.e_score_correction_bias"}


class MiniMaxM2Layer(WholeWidthQkNorm, GroupedMoeLayer):
    """WholeWidthQkNorm's attention over GroupedMoeLayer's experts."""

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """The q / k norms and the MoE, under MiniMax's (Mixtral's) names."""
        return super().locate_extra(_BIAS.get(rest) or mixtral_name(rest), prefix)
