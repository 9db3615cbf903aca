"""GPT-OSS's decoder layer: DecoderLayer's attention (q/k/v/o biases, learned sinks: the
ModelConfig's attention_sinks, kernels/sinks.py; every other layer windowed) and a mixture of
biased experts (transformers' GptOssMLP):

    router   logits = x @ router^T + router_bias; the top-k logits, then their softmax
    experts  act = clamped_swiglu(x @ w13[e]^T + b13[e]); out = act @ w2[e]^T + b2[e]
             (kernels/clamped_swiglu.py)

The checkpoint's experts come as transformers holds them, gate and up interleaved
([E, H, 2I], gate at the even columns) and down [E, I, H]; gpu/gpt_oss_weights.py turns them
into MoeLayer's w13 [E, 2I, H] (gate | up) and w2 [E, H, I] before the fill. OpenAI's MXFP4
files kept packed (MoeConfig.mxfp4: quantization "keep") give the layer each projection's
blocks and scales (uint8, kernels/mxfp4.py) in w13's and w2's row order instead, and
fused_moe reads them so.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.moe_layer import MoeLayer
from troupe.kernels.mxfp4 import GROUP, Mxfp4Experts
from troupe.kernels.ops import KernelOps

# checkpoint name (layer-relative) -> this layer's parameter
_OWN = {
    "mlp.router.weight": "router",
    "mlp.router.bias": "router_bias",
    "mlp.experts.gate_up_proj_bias": "b13",
    "mlp.experts.down_proj_bias": "b2",
}


class GptOssLayer(MoeLayer):
    """MoeLayer with the router's bias, the experts' biases and the clamped SwiGLU."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        moe = config.moe
        assert moe is not None and moe.clamped is not None and config.attention_sinks
        self.clamped = moe.clamped
        e, h = self.w13.shape[0], config.hidden_size

        def param(*shape: int) -> nn.Parameter:
            data = torch.empty(*shape, dtype=dtype, device=device)
            return nn.Parameter(data, requires_grad=False)

        self.router_bias = param(moe.num_experts)
        self.b13 = param(e, 2 * moe.intermediate_size)
        self.b2 = param(e, h)
        self.packed: dict[str, nn.Parameter] = {}
        self.mxfp4: tuple[Mxfp4Experts, Mxfp4Experts] | None = None
        if moe.mxfp4:  # uint8 blocks [E, N, K / 2] and scales [E, N, K / 32] of w13 and w2
            inter = moe.intermediate_size
            del self.w13, self.w2
            for name, n, k in (("w13", 2 * inter, h), ("w2", h, inter)):
                for part, width in zip(PARTS, (k // 2, k // GROUP), strict=True):
                    data = torch.empty(e, n, width, dtype=torch.uint8, device=device)
                    packed = nn.Parameter(data, requires_grad=False)
                    setattr(self, f"{name}_{part}", packed)
                    self.packed[f"mlp.experts.{_HF[name]}_{part}"] = packed
            # made once: the fill copies into these parameters, sleep mode keeps them
            w13, w2 = (
                Mxfp4Experts(*(self.packed[f"mlp.experts.{_HF[name]}_{part}"] for part in PARTS))
                for name in ("w13", "w2")
            )
            self.mxfp4 = w13, w2

    def mlp(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        weights, ids = self.route(x)
        w13, w2 = (self.w13, self.w2) if self.mxfp4 is None else self.mxfp4
        return ops.fused_moe(
            x, w13, w2, weights, ids, b13=self.b13, b2=self.b2, clamped=self.clamped
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k logits' softmax (in the logits' dtype, as transformers' router) and ids."""
        logits = F.linear(x, self.router, self.router_bias)
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top, dim=-1), ids

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """The router's and the experts' biases, then MoeLayer's names (the experts' weights
        arrive in its spelling, gpu/gpt_oss_weights.py)."""
        own = _OWN.get(rest)
        if own is not None:
            return getattr(self, own), (f"{prefix}.{own}",)
        packed = self.packed.get(rest)
        if packed is not None:
            return packed, (f"{prefix}.{_attribute(rest)}",)
        return None if self.packed else super().locate_extra(rest, prefix)

    def fill_parts(self) -> dict[str, tuple[str, ...]]:
        """MoeLayer's pieces of w13 and w2, or none: packed parameters fill whole."""
        return {} if self.packed else super().fill_parts()


_HF = {"w13": "gate_up_proj", "w2": "down_proj"}  # the checkpoint's names of w13 and w2
PARTS = ("blocks", "scales")  # an MXFP4 weight's two tensors, in Mxfp4Experts' order


def _attribute(name: str) -> str:
    """The layer's attribute of a packed checkpoint name ('mlp.experts.down_proj_scales' ->
    'w2_scales')."""
    stem, _, part = name.removeprefix("mlp.experts.").rpartition("_")
    return f"{'w13' if stem == 'gate_up_proj' else 'w2'}_{part}"
