"""DeepSeek-V2/V3's mixture of experts: grouped routing, routed experts and shared experts.

    out = fused_moe(x, routed experts, weights) + shared(x)     (transformers' DeepseekV3MoE)

The router (gate [E, H]) runs in fp32, as transformers keeps it (V3 holds gate.weight and
e_score_correction_bias in fp32); kernels/moe_router.route_grouped picks the experts: softmax
greedy or group-limited greedy (V2), sigmoid with the correction bias over the best groups (V3),
times routed_scaling_factor. The routed experts run in ops.fused_moe (w13 [E, 2I, H] gate | up,
w2 [E, H, I]); the shared experts are one SwiGLU MLP of n_shared * moe_intermediate_size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import new_param
from troupe.gpu.quant_linear import linear
from troupe.kernels.moe_router import route_grouped
from troupe.kernels.ops import KernelOps


class DeepseekMoe(nn.Module):
    """Router, routed experts and shared experts of one sparse DeepSeek layer."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        *,
        num_local_experts: int | None = None,
        shared_intermediate_size: int | None = None,
    ) -> None:
        """`num_local_experts`: the routed experts held (expert parallelism: a rank's share;
        the router still scores all of them); `shared_intermediate_size`: the shared MLP's rows
        (a tensor-parallel rank's cut), n_shared * moe_intermediate_size unless given."""
        super().__init__()
        moe = config.moe
        assert moe is not None and moe.routing is not None
        self.routing = moe.routing
        h, inter = config.hidden_size, moe.intermediate_size
        e = moe.num_experts if num_local_experts is None else num_local_experts
        shared = moe.num_shared_experts * inter
        if shared_intermediate_size is not None:
            shared = shared_intermediate_size

        def param(*shape: int, kind: torch.dtype = dtype) -> nn.Parameter:
            return new_param(*shape, dtype=kind, device=device)

        self.router = param(moe.num_experts, h, kind=torch.float32)
        self.correction_bias = (
            param(moe.num_experts, kind=torch.float32) if moe.routing.has_correction_bias else None
        )
        self.w13 = param(e, 2 * inter, h)
        self.w2 = param(e, h, inter)
        self.shared_gate_up = param(2 * shared, h) if shared else None
        self.shared_down = param(h, shared) if shared else None

    def forward(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        weights, ids = self.route(x)
        out = ops.fused_moe(x, self.w13, self.w2, weights.to(x.dtype), ids)
        if self.shared_gate_up is not None and self.shared_down is not None:
            out = out + linear(ops.silu_mul(linear(x, self.shared_gate_up)), self.shared_down)
        return out

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] fp32, expert ids [T, k]) of every token: the seam a
        tensor-parallel rank narrows to the experts it holds (gpu/tp_mla.py)."""
        return route_grouped(F.linear(x.float(), self.router), self.routing, self.correction_bias)

    def locate(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """(destination, fill keys) of a layer-relative HF name under mlp.; None otherwise.
        `prefix` is this module's name in the model (layers.<i>.experts)."""
        inter = self.w2.shape[2]
        parts = self.fill_parts()
        if rest == "mlp.gate.weight":
            return self.router, (f"{prefix}.router",)
        bias = self.correction_bias
        if rest == "mlp.gate.e_score_correction_bias" and bias is not None:
            return bias, (f"{prefix}.correction_bias",)
        if rest == "mlp.moe_statics.e_score_correction_bias" and bias is not None:
            return bias.view(1, -1), (f"{prefix}.correction_bias",)  # ERNIE 4.5's [1, E]
        if rest == "mlp.experts.gate_up_proj":
            return self.w13, tuple(f"{prefix}.w13#{p}" for p in parts["w13"])
        if rest == "mlp.experts.down_proj":
            return self.w2, tuple(f"{prefix}.w2#{p}" for p in parts["w2"])
        if rest.startswith("mlp.shared_experts.") and self.shared_gate_up is not None:
            shared = self.shared_gate_up.shape[0] // 2
            kind = rest.removeprefix("mlp.shared_experts.")
            if kind == "gate_proj.weight":
                return self.shared_gate_up[:shared], (f"{prefix}.shared_gate_up#gate",)
            if kind == "up_proj.weight":
                return self.shared_gate_up[shared:], (f"{prefix}.shared_gate_up#up",)
            if kind == "down_proj.weight" and self.shared_down is not None:
                return self.shared_down, (f"{prefix}.shared_down",)
            return None
        bits = rest.split(".")
        if len(bits) != 5 or bits[:2] != ["mlp", "experts"] or bits[4] != "weight":
            return None
        if not bits[2].isdigit() or int(bits[2]) >= self.w13.shape[0]:
            return None
        expert, kind = int(bits[2]), bits[3]
        targets = {
            "gate_proj": self.w13[expert, :inter],
            "up_proj": self.w13[expert, inter:],
            "down_proj": self.w2[expert],
        }
        if kind not in targets:
            return None
        param = "w2" if kind == "down_proj" else "w13"
        return targets[kind], (f"{prefix}.{param}#{expert}.{kind}",)

    def fill_parts(self) -> dict[str, tuple[str, ...]]:
        """Parameters filled piece by piece (name in this module -> the pieces' fill keys)."""
        experts = range(self.w13.shape[0])
        parts = {
            "w13": tuple(f"{e}.{kind}" for e in experts for kind in ("gate_proj", "up_proj")),
            "w2": tuple(f"{e}.down_proj" for e in experts),
        }
        if self.shared_gate_up is not None:
            parts["shared_gate_up"] = ("gate", "up")
        return parts
