"""GPT-OSS's expert activation: a clamped SwiGLU with a sigmoid slope and a shifted up half.

    gate = min(gate, limit)
    up   = clamp(up, -limit, limit)
    act  = (up + 1) * gate * sigmoid(alpha * gate)

transformers' GptOssExperts._apply_gate, on the gate and up halves after their biases. The
experts' ops (kernels/moe_reference.py, kernels/fused_moe.py, kernels/moe_split_k.py) take a
ClampedSwiglu where they would apply silu(gate) * up; the Triton kernels' form is
kernels/moe_block.swiglu. No Triton here: ModelConfig (gpu/moe_config.py) holds one.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class ClampedSwiglu:
    """The activation's two numbers (config.json's swiglu_alpha and swiglu_limit)."""

    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self) -> None:
        if not self.limit > 0:
            raise ValueError(f"swiglu_limit must be > 0; got {self.limit}")

    def __call__(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """act of the gate and up halves (torch; the reference's arithmetic)."""
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * gate * torch.sigmoid(gate * self.alpha)
