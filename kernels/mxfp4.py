"""MXFP4 expert weights (OpenAI's GPT-OSS files), kept packed: per expert and output row, the K
inputs in groups of 32, each group 16 bytes of e2m1 codes (two a byte, the even input in the
low nibble) and one e8m0 exponent (bias 127):

    w[e, n, k] = e2m1(code of k) * 2^(scales[e, n, k // 32] - 127)

e2m1 (sign, 2 exponent bits, 1 mantissa bit): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
Mxfp4Experts holds one projection of every expert (gate | up as w13's rows, or down as w2's);
kernels/fused_moe_mxfp4.py multiplies by it without unpacking it to memory, the reference
(kernels/moe_reference.py) unpacks one expert at a time. No Triton here: the CPU's ops read it.
"""

from __future__ import annotations

import dataclasses

import torch

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
GROUP = 32  # inputs per exponent


@dataclasses.dataclass(frozen=True)
class Mxfp4Experts:
    """blocks uint8 [E, N, K / 2] (two codes a byte) and scales uint8 [E, N, K / 32]."""

    blocks: torch.Tensor
    scales: torch.Tensor

    def __post_init__(self) -> None:
        e, n, half = self.blocks.shape
        if self.blocks.dtype != torch.uint8 or self.scales.dtype != torch.uint8:
            raise ValueError("MXFP4 blocks and scales must be uint8")
        if tuple(self.scales.shape) != (e, n, 2 * half // GROUP) or (2 * half) % GROUP:
            raise ValueError(
                f"MXFP4 scales {tuple(self.scales.shape)} do not match blocks "
                f"{tuple(self.blocks.shape)} (one per {GROUP} inputs)"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, N, K) of the dense weights."""
        e, n, half = self.blocks.shape
        return e, n, 2 * half

    def expert(self, index: int, dtype: torch.dtype) -> torch.Tensor:
        """Expert `index`'s dense [N, K] in `dtype`."""
        return unpack(self.blocks[index], self.scales[index]).to(dtype)


def unpack(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 [..., K] of blocks [..., K / 2] and scales [..., K / 32] (exact: bf16 holds every
    e2m1 value times a power of two)."""
    table = torch.tensor(E2M1, dtype=torch.bfloat16, device=blocks.device)
    codes = blocks.long()
    values = torch.stack([table[codes & 0x0F], table[codes >> 4]], dim=-1).flatten(-2)
    values = values.reshape(*values.shape[:-1], -1, GROUP)
    exponents = scales.to(torch.int32) - 127
    return torch.ldexp(values, exponents[..., None]).to(torch.bfloat16).flatten(-2)
