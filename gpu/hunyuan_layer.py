"""HunYuan dense's decoder layer (transformers' HunYuanDenseV1DecoderLayer): Llama's, but q and
k are RMS-normalised per head after the rotary, not before (self_attn.query_layernorm and
key_layernorm, one weight of head_dim each).

The fused q/k/v kernel normalises before it rotates. A rotation keeps a head's root mean
square, so normalising first with unit weights gives the rotated, normalised q and k exactly;
what is left is each dim's weight, which no rotation commutes with. In a score the two weights
meet dim by dim,

    q . k = sum_d (w_q[d] q'[d]) (w_k[d] k'[d]) = sum_d (w_q[d] w_k[d]) q'[d] k'[d],

so the queries take both (`scale_queries`, after the rotary) and the cache keeps k' as it is:
the same scores, and the values are not touched. The unit norms are buffers, not weights.

HunYuan MoE's layer (transformers' HunYuanMoEV1DecoderLayer) is that attention over MoeLayer's
experts, routed in fp32 (mlp.gate.wg), and an ungated MLP beside them that every token runs
(mlp.shared_mlp), held where the dense layer holds its MLP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, new_param
from troupe.gpu.moe_layer import MoeLayer
from troupe.kernels.moe_reference import route_topk
from troupe.kernels.ops import KernelOps

# HunYuan's names -> this layer's parameters
_NAMES = {
    "self_attn.query_layernorm.weight": "query_norm",
    "self_attn.key_layernorm.weight": "key_norm",
}


class HunyuanLayer(DecoderLayer):
    """Llama's layer with q / k normalised after the rotary, as above."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        for name in ("q_norm", "k_norm"):  # unit weights: the fused kernel's norm, unweighted
            delattr(self, name)
            self.register_buffer(name, torch.ones(config.head_dim, dtype=dtype, device=device))
        self.query_norm = new_param(config.head_dim, dtype=dtype, device=device)
        self.key_norm = new_param(config.head_dim, dtype=dtype, device=device)

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The rotated queries [T, Hq, D] times both norms' weights, dim by dim."""
        return super().scale_queries(q, positions) * (self.query_norm * self.key_norm)

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """The q / k norm weights under HunYuan's names."""
        name = _NAMES.get(rest)
        if name is None:
            return super().locate_extra(rest, prefix)
        return getattr(self, name), (f"{prefix}.{name}",)


class HunyuanMoeLayer(HunyuanLayer, MoeLayer):
    """HunyuanLayer's attention, MoeLayer's experts and DecoderLayer's MLP beside them."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        moe = config.moe
        assert moe is not None
        h, shared = config.hidden_size, moe.plain_shared_size
        self.router = new_param(moe.num_experts, h, dtype=torch.float32, device=device)
        self.shared = shared > 0
        if self.shared:  # the dense MLP's parameters, so they load and fill as its do
            self.gate_up_proj = new_param(2 * shared, h, dtype=dtype, device=device)
            self.down_proj = new_param(h, shared, dtype=dtype, device=device)

    def mlp(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        """The experts, plus the MLP beside them."""
        out = MoeLayer.mlp(self, x, ops)
        return out + DecoderLayer.mlp(self, x, ops) if self.shared else out

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax top-k over fp32 logits, renormalised; the weights in x's dtype."""
        weights, ids = route_topk(F.linear(x.float(), self.router), self.top_k, True)
        return weights.to(x.dtype), ids

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """The router (mlp.gate.wg) and the MLP beside the experts (mlp.shared_mlp.*)."""
        if rest == "mlp.gate.wg.weight":
            return self.router, (f"{prefix}.router",)
        if not rest.startswith("mlp.shared_mlp.") or not self.shared:
            return super().locate_extra(rest, prefix)
        gate_up, down = self.gate_up_proj, self.down_proj
        if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
            return None  # quantized as shipped: not read here
        width = down.shape[1]
        targets = {
            "gate_proj": (gate_up[:width], f"{prefix}.gate_up_proj#mlp.gate_proj"),
            "up_proj": (gate_up[width:], f"{prefix}.gate_up_proj#mlp.up_proj"),
            "down_proj": (down, f"{prefix}.down_proj"),
        }
        target = targets.get(rest.removeprefix("mlp.shared_mlp.").removesuffix(".weight"))
        return None if target is None else (target[0], (target[1],))
