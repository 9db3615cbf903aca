"""4-bit weights on the CPU in the native kernel's layout (gpu/cpu_q4dot.c): the one copy held.

Built straight from the GGUF bytes (a permutation: rows in tiles of 16, the 16 bytes of a
group split in quads; see the C file) with the factors beside them, per tile and group, in
fp16 where that holds them exactly (Q4_0, Q4_1: the file's own fp16) and fp32 otherwise (Q4_K).
Everything else reads this copy: `blocks()` (the exact Int4Blocks, of some rows: embedding
lookups), `expand()` (long prefills where `expands` says so) and the kernel itself.

Arithmetic: the activations are rounded to int8 per group of 32 (d = max|x| / 127; llama.cpp's
Q8_1), the weight's codes and factors are exact, sums are exact integers, the rest fp32. The
error against the exact product is at most sum_k |w_k| d_g / 2 per output (the activation
rounding), far above fp32's and below the 4-bit weight's own (tests/gpu/test_cpu_q4.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from troupe.gpu.cpu_q4lib import Q4Lib, long_prefill_dtype
from troupe.gpu.gguf_quant import Int4Blocks

TILE = 16  # weight rows per tile
GROUP = 32  # K per group (the kernel's only group size)
# Rows up to which the kernel runs on a CPU that multiplies bf16 natively; above, one bf16 GEMM
# over the weight expanded per call (`expands`; docs/benchmarks.md)
NATIVE_MAX_ROWS = 256
_EXPAND_TILES = 32  # tiles expanded at a time for a long prefill (512 rows)


def expands(rows: int) -> bool:
    """Whether a matmul of `rows` activation rows expands the weight per call into one bf16 GEMM
    instead of running the kernel: above NATIVE_MAX_ROWS rows on a CPU with AVX-512 BF16 or AMX
    (long_prefill_dtype). Elsewhere the kernel's integer dot products beat an fp32 GEMM at every
    size (AVX2 EPYC, the 7 weights of a SmolLM2 layer at 1,000 rows: 45 ms against 55 for the
    fp32 GEMM alone and 59-98 with the expansion; docs/benchmarks.md)."""
    return rows > NATIVE_MAX_ROWS and long_prefill_dtype() == torch.bfloat16


def fits_native(blocks: Int4Blocks) -> bool:
    """Whether the kernel takes this weight: groups of 32 along K."""
    return blocks.group_size == GROUP and blocks.shape[1] % GROUP == 0


def _factors(scale: torch.Tensor, bias: torch.Tensor, tiles: int) -> torch.Tensor:
    """[T, G, 2, 16] (scale then bias per tile and group), fp16 when exact else fp32."""
    pairs = torch.stack((scale, bias))
    half = pairs.half()
    pairs = half if torch.equal(half.float(), pairs) else pairs
    pad = tiles * TILE - scale.shape[0]
    pairs = F.pad(pairs, (0, 0, 0, pad)) if pad else pairs  # [2, Np, G]
    return pairs.view(2, tiles, TILE, -1).permute(1, 3, 0, 2).contiguous()


class CpuQ4:
    """One 4-bit weight [N, K] in the native kernel's layout; see the module docstring."""

    def __init__(self, blocks: Int4Blocks, lib: Q4Lib) -> None:
        if not fits_native(blocks):
            raise ValueError(f"native int4 kernel needs groups of {GROUP}")
        n, k = blocks.shape
        self.num_rows, self.k, self.group_size = n, k, GROUP
        self.tiles = -(-n // TILE)
        groups = k // GROUP
        packed = blocks.packed
        pad = self.tiles * TILE - n
        packed = F.pad(packed, (0, 0, 0, pad)) if pad else packed
        # GGUF byte e = 4 l + c of a group -> (tile, group, l, row in tile, c)
        view = packed.view(self.tiles, TILE, groups, 4, 4)
        self.codes = view.permute(0, 2, 3, 1, 4).contiguous()
        self.factors = _factors(blocks.scale, blocks.bias, self.tiles)
        self.lib = lib
        self.form = int(self.factors.dtype == torch.float32)  # Q4_F16 or Q4_F32 in the C file

    def device_tensors(self) -> tuple[torch.Tensor, ...]:
        """What it holds (sleep mode frees their storages: the kernel reads their addresses
        at each call, so they may come back elsewhere)."""
        return (self.codes, self.factors)

    def blocks(self, rows: torch.Tensor | None = None) -> Int4Blocks:
        """The exact Int4Blocks (of `rows` only, when given), from this layout."""
        n, k = self.num_rows, self.k
        if rows is None:
            packed = self.codes.permute(0, 3, 1, 2, 4).reshape(-1, k // 2)[:n]
            factors = self.factors.permute(2, 0, 3, 1).reshape(2, -1, k // GROUP)[:, :n]
            scale, bias = factors[0], factors[1]
        else:
            tile, within = rows.long() // TILE, rows.long() % TILE
            packed = self.codes[tile, :, :, within, :].reshape(-1, k // 2)
            scale = self.factors[tile, :, 0, within]
            bias = self.factors[tile, :, 1, within]
        return Int4Blocks(packed.contiguous(), scale.float(), bias.float(), GROUP)

    def expand(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The exact weight (scale * q + bias in fp32) in `dtype` (rounded once), [N, K], a few
        tiles at a time (the fp32 temporaries stay small: a long prefill's peak RSS)."""
        n, k = self.num_rows, self.k
        out = torch.empty((self.tiles * TILE, k), dtype=dtype)
        for start in range(0, self.tiles, _EXPAND_TILES):
            end = min(self.tiles, start + _EXPAND_TILES)
            codes = self.codes[start:end]  # [t, G, 4, 16, 4]
            both = torch.stack((codes & 15, codes >> 4), dim=2)  # [t, G, 2, 4, 16, 4]
            q = both.permute(0, 4, 1, 2, 3, 5).reshape((end - start) * TILE, -1, GROUP).float()
            f = self.factors[start:end].float().permute(2, 0, 3, 1).reshape(2, -1, k // GROUP)
            weight = torch.addcmul(f[1][..., None], q, f[0][..., None])
            out[start * TILE : end * TILE] = weight.view(-1, k)
        return out[:n]

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 x [M, K] (contiguous) -> fp32 [M, N] through the kernel."""
        codes, factors = self.codes.data_ptr(), self.factors.data_ptr()
        return self.lib.rows(x, codes, factors, self.form, self.num_rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N] in x's dtype."""
        if expands(x.shape[0]):
            return F.linear(x.to(torch.bfloat16), self.expand()).to(x.dtype)
        return self.rows(x.float().contiguous()).to(x.dtype)
