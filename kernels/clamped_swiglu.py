"""GPT-OSS's expert activation: a clamped SwiGLU with a sigmoid slope and a shifted up half.

    gate = min(gate, limit)
    up   = clamp(up, -limit, limit)
    act  = (up + 1) * gate * sigmoid(alpha * gate)

transformers' GptOssExperts._apply_gate, on the gate and up halves after their biases. The
experts' ops (kernels/moe_reference.py, kernels/fused_moe.py, kernels/moe_split_k.py) take a
ClampedSwiglu where they would apply silu(gate) * up.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl


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


@triton.jit
def clamped_swiglu(gate, up, alpha, limit):
    """act of fp32 gate and up tiles (the Triton form of ClampedSwiglu.__call__)."""
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    return (up + 1.0) * gate * tl.sigmoid(gate * alpha)
