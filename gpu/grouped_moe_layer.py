"""A decoder layer of Llama's attention whose MLP is DeepSeek-V3's routed and shared experts
(gpu/deepseek_moe.py): GLM-4.5's and dots.llm1's sparse layers (transformers'
Glm4MoeDecoderLayer and Dots1DecoderLayer from first_k_dense_replace on). Their dense layers are
DecoderLayer's; the attention's q/k/v biases, per-head q/k norms, partial rotary and windows
are ModelConfig flags.
"""

from __future__ import annotations

import torch
from troupe.gpu.deepseek_moe import DeepseekMoe
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer
from troupe.kernels.ops import KernelOps


class GroupedMoeLayer(DecoderLayer):
    """DecoderLayer with the dense MLP replaced by DeepseekMoe."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        del self.gate_up_proj, self.down_proj  # no dense MLP in this layer
        self.experts = DeepseekMoe(config, dtype, device)

    def mlp(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        return self.experts.forward(x, ops)

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """The router, its correction bias, the routed and the shared experts (mlp.*)."""
        return self.experts.locate(rest, f"{prefix}.experts")

    def fill_parts(self) -> dict[str, tuple[str, ...]]:
        return {f"experts.{name}": parts for name, parts in self.experts.fill_parts().items()}
