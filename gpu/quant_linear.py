"""Weight-only quantized linear layers: the weights stay as shipped and are expanded inside the
matmul. `linear` and `embedding` take a dense tensor or one of these, so the model calls one
function either way.

    Int4Linear   Int4Blocks (GGUF Q4_0, Q4_1, Q4_K: exact codes and per-32 scale and bias)
      CPU, <= CPU_PACKED_MAX_ROWS rows (decode): torch's _weight_int4pack_mm_for_cpu in
           bf16. Its format is w = (q - 8) * scale + zero per group, so zero = bias + 8 scale;
           scale and zero are rounded to bf16 and the activations too (documented
           re-quantisation: ~2^-9 of a step, far under the 4-bit step itself).
      CPU, more rows (prefill): the exact fp32 weight, expanded per call, then F.linear.
      CUDA: kernels/quant_gemv.py (Triton; scale and bias in fp16: exact for Q4_0/Q4_1).
    Int8Linear   Int8Blocks (GGUF Q8_0, Q6_K: int8 codes and per-32/16 scales)
      CPU, decode: torch's _weight_int8pack_mm (bf16) needs one scale per row: the codes are
           re-quantised once at load to per-row int8 (w' = round(w / r) r, r = max|w_row| /
           127; error <= r / 2). Prefill and the embedding lookup use the exact codes.
      CUDA: expanded to the model dtype at load (dense; make_quant_linear returns None).

    Fp8Linear    HF fp8 e4m3 (gpu/fp8_weights.py), CUDA only: kernels/quant_gemv.py.

The exact expansion of the GGUF forms equals gguf-py's dequantization bit for bit, so
quantization="dequantize" and this path differ only where the notes above say.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from troupe.gpu.fp8_weights import Fp8Weight
from troupe.gpu.gguf_quant import Int4Blocks, Int8Blocks, QuantBlocks

CPU_PACKED_MAX_ROWS = 16  # above: expanding the weight and one fp32 GEMM is faster (measured)


class Int4Linear:
    """A 4-bit weight [N, K]; see the module docstring."""

    def __init__(self, blocks: Int4Blocks, device: torch.device) -> None:
        self.blocks = blocks
        self.shape = blocks.shape
        self.device = device
        if device.type == "cpu":
            pad = -self.shape[0] % 16  # the packed format wants N in multiples of 16
            codes = blocks.codes().to(torch.int32)
            codes = F.pad(codes, (0, 0, 0, pad)) if pad else codes
            self._packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
            zero = blocks.bias + 8 * blocks.scale
            # [K / group, N, 2] = (scale, zero)
            scale_zero = torch.stack((blocks.scale, zero), dim=-1)
            scale_zero = F.pad(scale_zero, (0, 0, 0, 0, 0, pad)) if pad else scale_zero
            scale_zero = scale_zero.transpose(0, 1)
            self._scale_zero = scale_zero.contiguous().to(torch.bfloat16)
        else:  # fp16 factors: exact for Q4_0 and Q4_1 (fp16 in the file), rounded for Q4_K
            self.blocks = Int4Blocks(
                blocks.packed.to(device),
                blocks.scale.to(device, torch.float16),
                blocks.bias.to(device, torch.float16),
                blocks.group_size,
            )

    def dequantize(self) -> torch.Tensor:
        return self.blocks.dequantize()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cpu":
            from troupe.kernels.quant_gemv import int4_matmul

            b = self.blocks
            return int4_matmul(x, b.packed, b.scale, b.bias, b.group_size)
        if x.shape[0] > CPU_PACKED_MAX_ROWS:
            return F.linear(x, self.blocks.dequantize().to(x.dtype))
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self._packed, self.blocks.group_size, self._scale_zero
        )
        return out[:, : self.shape[0]].to(x.dtype)


class Int8Linear:
    """An 8-bit weight [N, K] (CPU); see the module docstring."""

    def __init__(self, blocks: Int8Blocks) -> None:
        self.blocks = blocks
        self.shape = blocks.shape
        n = self.shape[0]
        self._row_scale = torch.empty(n)
        self._row_codes = torch.empty(self.shape, dtype=torch.int8)
        for start in range(0, n, 4096):  # in slices: no full fp32 copy of a vocabulary
            rows = torch.arange(start, min(n, start + 4096))
            weight = blocks.rows(rows).dequantize()
            scale = weight.abs().amax(dim=1).clamp_min(1e-30) / 127
            self._row_scale[rows] = scale
            requant = torch.round(weight.div_(scale[:, None])).clamp_(-127, 127)
            self._row_codes[rows] = requant.to(torch.int8)
        self._row_scale_bf16 = self._row_scale.to(torch.bfloat16)

    def dequantize(self) -> torch.Tensor:
        return self.blocks.dequantize()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > CPU_PACKED_MAX_ROWS:
            return F.linear(x, self.blocks.dequantize().to(x.dtype))
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(
            x.to(torch.bfloat16), self._row_codes, self._row_scale_bf16
        )
        return out.to(x.dtype)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Exact rows `ids` as fp32 [len(ids), K]."""
        return self.blocks.rows(ids).dequantize()


class Fp8Linear:
    """An fp8 e4m3 weight with block or per-channel scales (CUDA: kernels/quant_gemv.py)."""

    def __init__(self, fp8: Fp8Weight, device: torch.device) -> None:
        self.fp8 = Fp8Weight(fp8.weight.to(device), fp8.scale.to(device, torch.float32))
        self.shape = fp8.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from troupe.kernels.quant_gemv import fp8_matmul

        return fp8_matmul(x, self.fp8.weight, self.fp8.scale)


QuantLinear = Int4Linear | Int8Linear | Fp8Linear
Weight = torch.Tensor | QuantLinear


def make_quant_linear(blocks: QuantBlocks | Fp8Weight, device: torch.device) -> QuantLinear | None:
    """The layer for `blocks` on `device`; None where it has no packed path (the loader then
    expands the tensor to the model dtype)."""
    if isinstance(blocks, Fp8Weight):
        return Fp8Linear(blocks, device) if device.type == "cuda" else None
    if isinstance(blocks, Int4Blocks):
        return Int4Linear(blocks, device)
    if device.type == "cpu":
        return Int8Linear(blocks)
    return None


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear over a dense or quantized weight."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    out = weight(x)
    return out if bias is None else out + bias


def embedding(ids: torch.Tensor, weight: Weight, dtype: torch.dtype) -> torch.Tensor:
    """Rows of a dense or quantized embedding table, in `dtype`."""
    if isinstance(weight, torch.Tensor):
        return F.embedding(ids, weight)
    if isinstance(weight, Int8Linear):
        return weight.embedding(ids).to(dtype)
    if isinstance(weight, Fp8Linear):
        fp8 = weight.fp8
        rows = Fp8Weight(fp8.weight[ids], fp8.scale[ids // fp8.block_rows])
        return rows.dequantize().to(dtype)
    return weight.blocks.rows(ids).dequantize().to(dtype)
