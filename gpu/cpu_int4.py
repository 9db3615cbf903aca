"""4-bit weights on the CPU: torch's packed int4 format built straight from the GGUF codes, and
the expansion that prefill-sized matmuls use.

torch's `_weight_int4pack_mm_for_cpu` reads weights in the layout of
`_convert_weight_to_int4pack_for_cpu`, which depends on the CPU torch runs on: per block of B
rows (64 with AVX-512, 32 with AVX2 only), a [K, B / 2] byte array whose byte (k, j) holds row
j's code at column k in its low nibble and row j + B / 2's in its high one. B is read once from
torch itself (`layout_rows`, which checks the whole layout of a probe; tests/gpu/test_cpu_int4.py
checks it against torch's converter). For N a multiple of B it is built here from the GGUF
nibbles in a few uint8 passes; torch's converter takes unpacked int32 codes (8x the bytes, ~2.5x
slower at load), so it only serves other N (padded to 16 rows), and every N on a CPU whose
layout is neither.

Its factors are w = (q - 8) * scale + zero per group, so zero = bias + 8 scale, both in bf16,
[K / group, N, 2]; the activations go in as bf16 too (the rounding documented in
gpu/quant_linear.py).

Long prefills: the packed kernel is slow at that size; above CPU_PACKED_MAX_ROWS rows the weight
is expanded per call (exact fp32 w, rounded once where the GEMM runs in bf16) and one GEMM runs in
gpu/cpu_q4lib.long_prefill_dtype(): bf16 on a CPU with AVX-512 BF16 or AMX (a 1,000-row fp32
GEMM took 3-8x longer than bf16 on such a CPU), fp32 on one with AVX2 alone (bf16 ~5x slower).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from troupe.gpu.cpu_q4lib import long_prefill_dtype
from troupe.gpu.gguf_quant import Int4Blocks, pack_nibbles

# Above this many rows one GEMM over the weight expanded per call is faster than the
# packed kernel (measured here, 3,072 x 576: 100 rows 7 vs 15 ms, 200 rows 12 vs 14 ms, 1,000
# rows 68 vs 18 ms; the expansion alone is ~8 ms)
CPU_PACKED_MAX_ROWS = 256
_EXPAND_ROWS = 512  # rows expanded at a time for a long prefill (a multiple of layout_rows())


@functools.cache
def layout_rows() -> int:
    """Rows per block of torch's CPU int4 layout on this CPU (64 or 32), or 0 when torch packs
    in neither of the layouts built here (its converter then packs every weight)."""
    codes = torch.randint(0, 16, (64, 64), generator=torch.Generator().manual_seed(0))
    want = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    nibbles = pack_nibbles(codes.to(torch.uint8))
    return next((b for b in (64, 32) if torch.equal(_pack(nibbles, 64, 64, b), want)), 0)


def _pack(nibbles: torch.Tensor, n: int, k: int, block: int) -> torch.Tensor:
    """GGUF nibbles [N, K / 2] (Q4_0 order: byte i of a 32-code chunk holds code i low and
    i + 16 high) in the layout of `block` rows. Rows j (a) and j + block / 2 (b) of a block go
    to one byte: the low nibbles of a chunk's first half, then its high ones, [K, block / 2]."""
    rows = nibbles.view(n // block, 2, block // 2, k // 32, 16)
    a, b = rows[:, 0].permute(0, 2, 3, 1), rows[:, 1].permute(0, 2, 3, 1)
    low, high = (a & 15) | (b << 4), (a >> 4) | (b & 0xF0)
    return torch.stack((low, high), dim=2).reshape(n, k // 2)


def _packs_here(num_rows: int) -> bool:
    """Whether pack_int4_for_cpu builds the layout itself for a weight of num_rows rows."""
    block = layout_rows()
    return block > 0 and num_rows % block == 0


def pack_int4_for_cpu(blocks: Int4Blocks) -> torch.Tensor:
    """The codes of `blocks` in torch's CPU int4pack layout: [ceil16(N), K / 2] uint8."""
    n, k = blocks.shape
    if _packs_here(n):
        return _pack(blocks.packed, n, k, layout_rows())
    pad = -n % 16
    codes = blocks.codes().to(torch.int32)
    wide = F.pad(codes, (0, 0, 0, pad)) if pad else codes
    packed: torch.Tensor = torch.ops.aten._convert_weight_to_int4pack_for_cpu(wide, 1)
    return packed


def scale_zero_for_cpu(blocks: Int4Blocks) -> torch.Tensor:
    """(scale, zero) [K / group, ceil16(N), 2] bf16 with zero = bias + 8 scale."""
    pad = 0 if _packs_here(blocks.shape[0]) else -blocks.shape[0] % 16
    scale_zero = torch.stack((blocks.scale, blocks.bias + 8 * blocks.scale), dim=-1)
    scale_zero = F.pad(scale_zero, (0, 0, 0, 0, 0, pad)) if pad else scale_zero
    return scale_zero.transpose(0, 1).contiguous().to(torch.bfloat16)


def unpack_int4_for_cpu(
    packed: torch.Tensor, k: int, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """uint8 codes [N, K] (or of `rows` only) back from the layout pack_int4_for_cpu builds
    (N a multiple of B = layout_rows()): row r is column r % (B / 2) of block r // B, in the
    high nibble when r % B >= B / 2."""
    size = layout_rows()
    half = size // 2
    blocks = packed.view(-1, k, half)
    if rows is None:
        both = torch.cat((blocks & 15, blocks >> 4), dim=2)  # [blocks, K, B rows]
        return both.transpose(1, 2).reshape(-1, k)
    r = rows.long()
    picked = blocks[r // size, :, r % half]  # [len(rows), K]
    shift = (r % size >= half).to(torch.uint8)[:, None] * 4
    return (picked >> shift) & 15


def expand_bf16(blocks: Int4Blocks) -> torch.Tensor:
    """The weight [N, K] in bf16: the exact fp32 value (scale * q + bias), rounded once."""
    return blocks.dequantize().to(torch.bfloat16)


class CpuInt4:
    """One 4-bit weight on the CPU: packed for decode rows, expanded for long prefills.

    Held: the packed codes and their bf16 (scale, zero) for the kernel, and the exact scale
    and bias for the expansion (in fp16 where that holds them exactly, as for Q4_0 and Q4_1,
    whose factors the file ships in fp16; else fp32); the GGUF nibbles themselves are dropped
    (the codes are read back from the packed copy), except where torch's converter packed them
    (N not a multiple of layout_rows(): torch's padded form)."""

    def __init__(self, blocks: Int4Blocks) -> None:
        self.num_rows, self.k = blocks.shape
        self.group_size = blocks.group_size
        self.packed = pack_int4_for_cpu(blocks)
        self.scale_zero = scale_zero_for_cpu(blocks)
        self._scale, self._bias = _compact(blocks.scale), _compact(blocks.bias)
        self._nibbles = None if _packs_here(self.num_rows) else blocks.packed

    def device_tensors(self) -> tuple[torch.Tensor, ...]:
        """What it holds (sleep mode frees and restores their storages)."""
        held = (self.packed, self.scale_zero, self._scale, self._bias)
        return held if self._nibbles is None else (*held, self._nibbles)

    @property
    def scale(self) -> torch.Tensor:
        """The exact fp32 scale [N, K / group]."""
        return self._scale.float()

    @property
    def bias(self) -> torch.Tensor:
        """The exact fp32 bias [N, K / group]."""
        return self._bias.float()

    def blocks(self, rows: torch.Tensor | None = None) -> Int4Blocks:
        """The exact Int4Blocks (of `rows` only, when given), rebuilt from the packed codes."""
        scale = self.scale if rows is None else self._scale[rows].float()
        bias = self.bias if rows is None else self._bias[rows].float()
        if self._nibbles is not None:
            nibbles = self._nibbles if rows is None else self._nibbles[rows]
        else:
            nibbles = pack_nibbles(unpack_int4_for_cpu(self.packed, self.k, rows))
        return Int4Blocks(nibbles, scale, bias, self.group_size)

    def expand(
        self, dtype: torch.dtype = torch.bfloat16, chunk_rows: int = _EXPAND_ROWS
    ) -> torch.Tensor:
        """The exact weight in `dtype` (rounded once), from the packed codes, `chunk_rows` (a
        multiple of 64, so of layout_rows()) at a time: the fp32 temporaries stay a few MiB (a
        long prefill's peak RSS)."""
        if self._nibbles is not None:
            return self.blocks().dequantize().to(dtype)
        n, k, g = self.num_rows, self.k, self.group_size
        out = torch.empty((n, k), dtype=dtype)
        for start in range(0, n, chunk_rows):
            end = min(n, start + chunk_rows)
            q = unpack_int4_for_cpu(self.packed[start:end], k).view(end - start, -1, g).float()
            scale, bias = self._scale[start:end, :, None], self._bias[start:end, :, None]
            weight = torch.addcmul(bias.float(), q, scale.float())
            out[start:end] = weight.view(end - start, k)  # rounded as .to(dtype) does
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N] in x's dtype."""
        if x.shape[0] > CPU_PACKED_MAX_ROWS:
            dtype = long_prefill_dtype()
            return F.linear(x.to(dtype), self.expand(dtype)).to(x.dtype)
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.packed, self.group_size, self.scale_zero
        )
        if out.shape[1] != self.num_rows:
            out = out[:, : self.num_rows]
        return out.to(x.dtype)


def _compact(factors: torch.Tensor) -> torch.Tensor:
    """fp32 `factors` as fp16 when that round-trips every value exactly, else unchanged."""
    half = factors.half()
    return half if torch.equal(half.float(), factors) else factors
