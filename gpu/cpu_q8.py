"""8-bit weights (GGUF Q8_0) on the CPU in the native kernel's layout (gpu/cpu_q4dot.c): the one
copy held, with the file's exact codes and fp16 scales.

Rows in tiles of 16, K in groups of 32, each byte q + 128 (vpdpbusd takes unsigned weights; the
kernel subtracts 128 sum(xq) per group), the 16 rows' scales beside each group. `blocks()` reads
the exact Int8Blocks back (embedding lookups, long prefills on a bf16 CPU). The activations are rounded to int8
per group of 32 as for the 4-bit kernel (gpu/cpu_q4.py); against fbgemm's path (gpu/int8_rows.py)
the weight is not re-quantised per row and the activations get a scale per group, not per call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from troupe.gpu.cpu_q4 import GROUP, TILE, expands
from troupe.gpu.cpu_q4lib import Q4Lib
from troupe.gpu.gguf_quant import Int8Blocks

_FORM = 2  # Q8_F16 in the C file


def fits_native_int8(blocks: Int8Blocks) -> bool:
    """Groups of 32 with scales that fp16 holds exactly (Q8_0; not Q6_K's groups of 16)."""
    scale = blocks.scale
    return (
        blocks.group_size == GROUP
        and blocks.shape[1] % GROUP == 0
        and torch.equal(scale.half().float(), scale)
    )


class CpuQ8:
    """One 8-bit weight [N, K] in the native kernel's layout; see the module docstring."""

    def __init__(self, blocks: Int8Blocks, lib: Q4Lib) -> None:
        if not fits_native_int8(blocks):
            raise ValueError(f"native int8 kernel needs groups of {GROUP} with fp16 scales")
        n, k = blocks.shape
        self.num_rows, self.k = n, k
        self.tiles = -(-n // TILE)
        pad = self.tiles * TILE - n
        codes = blocks.codes.view(torch.uint8) ^ 0x80  # q + 128
        codes = F.pad(codes, (0, 0, 0, pad)) if pad else codes
        view = codes.view(self.tiles, TILE, k // GROUP, GROUP // 4, 4)
        self.codes = view.permute(0, 2, 3, 1, 4).contiguous()  # [T, G, 8, 16, 4]
        scale = blocks.scale.half()
        scale = F.pad(scale, (0, 0, 0, pad)) if pad else scale
        self.factors = scale.view(self.tiles, TILE, -1).transpose(1, 2).contiguous()  # [T, G, 16]
        self.lib = lib

    def device_tensors(self) -> tuple[torch.Tensor, ...]:
        """What it holds (sleep mode frees their storages: the kernel reads their addresses
        at each call, so they may come back elsewhere)."""
        return (self.codes, self.factors)

    def blocks(self, rows: torch.Tensor | None = None) -> Int8Blocks:
        """The exact Int8Blocks (of `rows` only, when given), from this layout."""
        n, k = self.num_rows, self.k
        if rows is None:
            codes = self.codes.permute(0, 3, 1, 2, 4).reshape(-1, k)[:n]
            scale = self.factors.transpose(1, 2).reshape(-1, k // GROUP)[:n]
        else:
            tile, within = rows.long() // TILE, rows.long() % TILE
            codes = self.codes[tile, :, :, within, :].reshape(-1, k)
            scale = self.factors[tile, :, within]
        return Int8Blocks((codes ^ 0x80).view(torch.int8).contiguous(), scale.float(), GROUP)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 x [M, K] (contiguous) -> fp32 [M, N] through the kernel."""
        codes, factors = self.codes.data_ptr(), self.factors.data_ptr()
        return self.lib.rows(x, codes, factors, _FORM, self.num_rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N] in x's dtype; the exact weight in x's dtype where the 4-bit
        weights expand (gpu/cpu_q4.expands)."""
        if expands(x.shape[0]):
            return F.linear(x, self.blocks().dequantize().to(x.dtype))
        return self.rows(x.float().contiguous()).to(x.dtype)
