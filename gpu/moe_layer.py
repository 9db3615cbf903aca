"""A decoder layer whose MLP is a mixture of experts (Qwen3-MoE's and Qwen2-MoE's sparse layers,
Mixtral's).

Attention is DecoderLayer's. The MLP is a router (gate [E, H]) picking top-k experts per token
(kernels/moe_reference.route_topk) and the ops' fused_moe over all experts' weights of the layer,
held as two tensors: w13 [E, 2I, H] (gate | up) and w2 [E, H, I]. Checkpoints name experts one
by one (mlp.experts.<e>.gate_proj.weight ...) or, as transformers 5 holds them in memory, fused
(mlp.experts.gate_up_proj, mlp.experts.down_proj); `locate` maps both, and Mixtral's names
(block_sparse_moe.gate, block_sparse_moe.experts.<e>.w1 | w3 | w2: gate | up | down).

Qwen2-MoE adds a shared expert every token runs (mlp.shared_expert.*, a SwiGLU MLP), its output
times sigmoid(mlp.shared_expert_gate . x), one scalar per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer
from troupe.gpu.quant_linear import linear
from troupe.kernels.moe_reference import route_topk
from troupe.kernels.ops import KernelOps


class MoeLayer(DecoderLayer):
    """DecoderLayer with the dense MLP replaced by router + experts."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        layer_index: int = 0,
        *,
        num_local_experts: int | None = None,
    ) -> None:
        """`num_local_experts`: the experts this layer holds (expert parallelism: a rank's
        share, gpu/tp_moe.py); None: all. The router scores every expert either way."""
        super().__init__(config, dtype, device, layer_index)
        moe = config.moe
        assert moe is not None and moe.sparse_layers[layer_index]
        del self.gate_up_proj, self.down_proj  # no dense MLP in this layer
        h, inter = config.hidden_size, moe.intermediate_size
        e = moe.num_experts if num_local_experts is None else num_local_experts

        def param(*shape: int) -> nn.Parameter:
            data = torch.empty(*shape, dtype=dtype, device=device)
            return nn.Parameter(data, requires_grad=False)

        self.router = param(moe.num_experts, h)
        self.w13 = param(e, 2 * inter, h)
        self.w2 = param(e, h, inter)
        self.top_k = moe.top_k
        self.renormalize = moe.norm_topk_prob
        shared = moe.gated_shared_size
        self.shared_gate_up = param(2 * shared, h) if shared else None
        self.shared_down = param(h, shared) if shared else None
        self.shared_gate = param(1, h) if shared else None

    def mlp(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        """Router softmax top-k, then the fused experts (ops.fused_moe)."""
        weights, ids = self.route(x)
        out = ops.fused_moe(x, self.w13, self.w2, weights, ids)
        if self.shared_gate_up is None or self.shared_down is None or self.shared_gate is None:
            return out
        shared = linear(ops.silu_mul(linear(x, self.shared_gate_up)), self.shared_down)
        return out + torch.sigmoid(linear(x, self.shared_gate)) * shared

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, ids into w13 / w2) [T, k] of each token's experts (a seam: expert
        parallelism, gpu/tp_moe.py, maps the ids to the rank's experts)."""
        return route_topk(F.linear(x, self.router), self.top_k, self.renormalize)

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """Destination and fill keys of a layer-relative HF name (e.g. 'mlp.gate.weight',
        'mlp.experts.3.up_proj.weight', 'mlp.experts.gate_up_proj'); None if not an MoE weight."""
        num_experts = self.w13.shape[0]
        parts = self.fill_parts()
        rest = mixtral_name(rest)
        if rest == "mlp.gate.weight":
            return self.router, (f"{prefix}.router",)
        if rest.startswith("mlp.shared_expert"):
            return self._locate_shared(rest.removeprefix("mlp."), prefix)
        if rest == "mlp.experts.gate_up_proj":
            return self.w13, tuple(f"{prefix}.w13#{p}" for p in parts["w13"])
        if rest == "mlp.experts.down_proj":
            return self.w2, tuple(f"{prefix}.w2#{p}" for p in parts["w2"])
        bits = rest.split(".")
        if len(bits) != 5 or bits[:2] != ["mlp", "experts"] or bits[4] != "weight":
            return None
        if not bits[2].isdigit() or int(bits[2]) >= num_experts:
            return None
        expert, kind = int(bits[2]), bits[3]
        inter = self.w2.shape[2]
        if kind == "gate_proj":
            target = self.w13[expert, :inter]
        elif kind == "up_proj":
            target = self.w13[expert, inter:]
        elif kind == "down_proj":
            target = self.w2[expert]
        else:
            return None
        param = "w2" if kind == "down_proj" else "w13"
        return target, (f"{prefix}.{param}#{expert}.{kind}",)

    def _locate_shared(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """Qwen2-MoE's shared expert and its gate (names without `mlp.`)."""
        if self.shared_gate_up is None or self.shared_down is None or self.shared_gate is None:
            return None
        shared = self.shared_gate_up.shape[0] // 2
        targets = {
            "shared_expert.gate_proj.weight": (self.shared_gate_up[:shared], "shared_gate_up#gate"),
            "shared_expert.up_proj.weight": (self.shared_gate_up[shared:], "shared_gate_up#up"),
            "shared_expert.down_proj.weight": (self.shared_down, "shared_down"),
            "shared_expert_gate.weight": (self.shared_gate, "shared_gate"),
        }
        if rest not in targets:
            return None
        target, key = targets[rest]
        return target, (f"{prefix}.{key}",)

    def fill_parts(self) -> dict[str, tuple[str, ...]]:
        """The pieces fill_weights (gpu/weight_fill.py) must fill per parameter: every expert's
        projections, and the shared expert's gate and up."""
        experts = range(self.w13.shape[0])
        parts = {
            "w13": tuple(f"{e}.{kind}" for e in experts for kind in ("gate_proj", "up_proj")),
            "w2": tuple(f"{e}.down_proj" for e in experts),
        }
        if self.shared_gate_up is not None:
            parts["shared_gate_up"] = ("gate", "up")
        return parts


_MIXTRAL_KINDS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
# GraniteMoE's experts stacked as transformers' fused ones ([E, 2I, H] gate | up, [E, H, I])
_GRANITE_NAMES = {
    "block_sparse_moe.input_linear.weight": "mlp.experts.gate_up_proj",
    "block_sparse_moe.output_linear.weight": "mlp.experts.down_proj",
    "block_sparse_moe.router.layer.weight": "mlp.gate.weight",
}


def mixtral_name(rest: str) -> str:
    """A Mixtral or GraniteMoE checkpoint's expert or router name in Qwen3-MoE's spelling
    (others as given)."""
    if not rest.startswith("block_sparse_moe."):
        return rest
    if rest in _GRANITE_NAMES:
        return _GRANITE_NAMES[rest]
    bits = rest.split(".")
    bits[0] = "mlp"
    if len(bits) == 5 and bits[1] == "experts":
        bits[3] = _MIXTRAL_KINDS.get(bits[3], bits[3])
    return ".".join(bits)
