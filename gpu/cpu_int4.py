"""4-bit weights on the CPU: torch's packed int4 format built straight from the GGUF codes, and
the bf16 expansion that prefill-sized matmuls use.

torch's `_weight_int4pack_mm_for_cpu` reads weights in the layout of
`_convert_weight_to_int4pack_for_cpu`: per block of 64 rows, a [K, 32] byte array whose byte
(k, j) holds row j's code at column k in its low nibble and row j + 32's in its high one
(tests/gpu/test_cpu_int4.py checks it against torch's converter). For N a multiple of 64 it is
built here from the GGUF nibbles in a few uint8 passes; torch's converter takes unpacked int32
codes (8x the bytes, ~2.5x slower at load), so it only serves other N (padded to 16 rows).

Its factors are w = (q - 8) * scale + zero per group, so zero = bias + 8 scale, both in bf16,
[K / group, N, 2]; the activations go in as bf16 too (the rounding documented in
gpu/quant_linear.py).

Long prefills: a 1,000-row fp32 GEMM takes 3-8x longer than bf16 on this project's CPU (AVX-512
bf16 and AMX, oneDNN), and the packed kernel is slower still at that size; above
CPU_PACKED_MAX_ROWS rows the weight is expanded to bf16 per call (exact fp32 w rounded once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from troupe.gpu.gguf_quant import Int4Blocks

# Above this many rows one bf16 GEMM over the weight expanded per call is faster than the
# packed kernel (measured here, 3,072 x 576: 100 rows 7 vs 15 ms, 200 rows 12 vs 14 ms, 1,000
# rows 68 vs 18 ms; the expansion alone is ~8 ms)
CPU_PACKED_MAX_ROWS = 256
_BLOCK_N = 64  # rows per block of torch's CPU int4 layout


def pack_int4_for_cpu(blocks: Int4Blocks) -> torch.Tensor:
    """The codes of `blocks` in torch's CPU int4pack layout: [ceil16(N), K / 2] uint8."""
    n, k = blocks.shape
    if n % _BLOCK_N:
        pad = -n % 16
        codes = blocks.codes().to(torch.int32)
        wide = F.pad(codes, (0, 0, 0, pad)) if pad else codes
        packed: torch.Tensor = torch.ops.aten._convert_weight_to_int4pack_for_cpu(wide, 1)
        return packed
    # Q4_0 nibble order: byte i of a group holds element i (low) and i + 16 (high). Rows j
    # (a) and j + 32 (b) of a block go to one byte: low nibbles of the group's first half,
    # then its high nibbles, each [K (group, half, i), 32 (j)].
    groups = k // blocks.group_size
    rows = blocks.packed.view(n // _BLOCK_N, 2, _BLOCK_N // 2, groups, blocks.group_size // 2)
    a, b = rows[:, 0].permute(0, 2, 3, 1), rows[:, 1].permute(0, 2, 3, 1)
    low, high = (a & 15) | (b << 4), (a >> 4) | (b & 0xF0)
    return torch.stack((low, high), dim=2).reshape(n, k // 2)


def scale_zero_for_cpu(blocks: Int4Blocks) -> torch.Tensor:
    """(scale, zero) [K / group, ceil16(N), 2] bf16 with zero = bias + 8 scale."""
    pad = -blocks.shape[0] % 16 if blocks.shape[0] % _BLOCK_N else 0
    scale_zero = torch.stack((blocks.scale, blocks.bias + 8 * blocks.scale), dim=-1)
    scale_zero = F.pad(scale_zero, (0, 0, 0, 0, 0, pad)) if pad else scale_zero
    return scale_zero.transpose(0, 1).contiguous().to(torch.bfloat16)


def expand_bf16(blocks: Int4Blocks) -> torch.Tensor:
    """The weight [N, K] in bf16: the exact fp32 value (scale * q + bias), rounded once."""
    n, k = blocks.shape
    q = blocks.codes().view(n, -1, blocks.group_size).float()
    weight = torch.addcmul(blocks.bias[..., None], q, blocks.scale[..., None])
    return weight.view(n, k).to(torch.bfloat16)


class CpuInt4:
    """One 4-bit weight on the CPU: packed for decode rows, expanded to bf16 for prefill."""

    def __init__(self, blocks: Int4Blocks) -> None:
        self.blocks = blocks
        self.num_rows = blocks.shape[0]
        self.packed = pack_int4_for_cpu(blocks)
        self.scale_zero = scale_zero_for_cpu(blocks)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N] in x's dtype."""
        if x.shape[0] > CPU_PACKED_MAX_ROWS:
            return F.linear(x.to(torch.bfloat16), expand_bf16(self.blocks)).to(x.dtype)
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.packed, self.blocks.group_size, self.scale_zero
        )
        if out.shape[1] != self.num_rows:
            out = out[:, : self.num_rows]
        return out.to(x.dtype)
