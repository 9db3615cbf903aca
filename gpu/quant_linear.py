"""Weight-only quantized linear layers: the weights stay as shipped and are expanded inside the
matmul. `linear` and `embedding` take a dense tensor or one of these, so the model calls one
function either way.

    Int4Linear   Int4Blocks (GGUF Q4_0, Q4_1, Q4_K, HF GPTQ / AWQ: exact codes and per-32
                 scale and bias; GPTQ act-order gathers the input in `in_perm`'s order first,
                 and takes no fast path that calls the CPU kernel directly: cpu_int4 is None)
      CPU with AVX-512 VNNI or AVX2, and gcc (EngineConfig.cpu_native_kernels, the default;
           gpu/cpu_q4.py, gpu/cpu_q4dot.c), any rows, or <= NATIVE_MAX_ROWS (256) on a CPU
           with native bf16 GEMMs (cpu_q4.expands): the file's codes permuted at load into the
           kernel's tiles, exact factors;
           each call rounds the activations to int8 per group of 32 (d = max|x| / 127, as
           llama.cpp's Q8_1) and sums integer dot products (vpdpbusd; vpmaddubsw with AVX2
           alone: the same bits), scaled and added in fp32; the error is at most sum |w| d / 2
           per group (tests/gpu/test_cpu_q4.py). A CPU with neither, no gcc, or groups other
           than 32: the next form.
      CPU otherwise (gpu/cpu_int4.py), <= CPU_PACKED_MAX_ROWS (256) rows: torch's
           _weight_int4pack_mm_for_cpu, the file's codes repacked at load into its layout. Its
           format is w = (q - 8) * scale + zero per group, so zero = bias + 8 scale; scale and
           zero are rounded to bf16 and the activations too (~2^-9 of a step, far under the
           4-bit step itself).
      CPU, more rows (long prefills) on a CPU with AVX-512 BF16 or AMX, and the torch form's on
           any CPU: the exact weight expanded per call, one GEMM in
           gpu/cpu_q4lib.long_prefill_dtype(): bf16 (weight and activations rounded; oneDNN)
           where native, exact fp32 elsewhere (bf16 is ~5x slower on AVX2).
      CUDA: kernels/quant_int4.py (Triton; the codes in its column layout, scale and bias in
           fp16: exact for Q4_0/Q4_1).
    Int8Linear   Int8Blocks (GGUF Q8_0, Q6_K: int8 codes and per-32/16 scales)
      CPU with the native kernel, Q8_0 (gpu/cpu_q8.py): the exact codes and fp16 scales in the
           kernel's tiles (the one copy kept; embedding rows read back from it), activations
           rounded to int8 per group of 32 as for Int4Linear, at the sizes it runs for Int4
           (cpu_q4.expands); longer prefills on a bf16 CPU use the exact weight.
      CPU otherwise (and Q6_K), decode: fbgemm's dynamic int8 linear
           (torch.ops.quantized.linear_dynamic) needs one scale per row: the codes are
           re-quantised once at load to per-row int8 (w' = round(w / r) r, r = max|w_row| / 127;
           error <= r / 2), and fbgemm rounds each call's activations to 8 bits (one scale per
           call); to 7 bits on a CPU without AVX-512 VNNI, whose u8 x s8 pair sums (vpmaddubsw)
           saturate int16 at full range (fbgemm_reduce_range). 2.5x faster than aten's
           _weight_int8pack_mm for the 49,152-row lm_head here. Prefill and the embedding
           lookup use the exact codes.
      CUDA: expanded to the model dtype at load (dense; make_quant_linear returns None).

    Fp8Linear    HF fp8 e4m3 (gpu/fp8_weights.py), CUDA only: kernels/quant_fp8.py (its column
                 layout; K and the scale blocks along K multiples of 16, else expanded to the
                 model dtype at load).

The exact expansion of the GGUF forms equals gguf-py's dequantization bit for bit, so
quantization="dequantize" and this path differ only where the notes above say.
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING, Any, Union

import torch
import torch.nn.functional as F
from troupe.gpu.cpu_int4 import CPU_PACKED_MAX_ROWS, CpuInt4
from troupe.gpu.cpu_q4 import CpuQ4, fits_native
from troupe.gpu.cpu_q4lib import Q4Lib, cpu_flags
from troupe.gpu.cpu_q8 import CpuQ8, fits_native_int8
from troupe.gpu.fp8_weights import Fp8Weight
from troupe.gpu.gguf_quant import Int4Blocks, Int8Blocks, QuantBlocks
from troupe.gpu.int8_rows import per_row_int8

if TYPE_CHECKING:  # the CUDA forms: their modules import Triton, which a CPU engine never needs
    from troupe.gpu.lora_linear import LoraLinear
    from troupe.kernels.quant_int4 import Int4Cols


class Int4Linear:
    """A 4-bit weight [N, K]; see the module docstring."""

    def __init__(
        self,
        blocks: Int4Blocks,
        device: torch.device,
        q4: Q4Lib | None = None,
        in_perm: torch.Tensor | None = None,
    ) -> None:
        self.shape = blocks.shape
        self.device = device
        # GPTQ act-order (gpu/gptq_awq_unpack.py): column j of `blocks` multiplies input
        # in_perm[j], so each call gathers its input in that order first
        self.in_perm = None if in_perm is None else in_perm.to(device)
        # CPU: one packed copy is kept (the native kernel's, else torch's); blocks() rebuilds
        # the exact form from it
        self._cpu: CpuQ4 | CpuInt4 | None = None
        if device.type == "cpu":
            native = q4 is not None and fits_native(blocks)
            self._cpu = CpuQ4(blocks, q4) if q4 is not None and native else CpuInt4(blocks)
        self._cuda: Int4Cols | None = None
        if device.type != "cpu":  # fp16 factors: exact for Q4_0 and Q4_1, rounded for Q4_K
            assert blocks.group_size == 32, (
                f"the GPU kernels take groups of 32, not {blocks.group_size}"
            )
            from troupe.kernels.quant_int4 import Int4Cols

            self._cuda = Int4Cols.from_rows(
                blocks.packed.to(device), blocks.scale.to(device), blocks.bias.to(device)
            )

    def device_tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor it holds (sleep mode: gpu/sleep_parts.py)."""
        perm = () if self.in_perm is None else (self.in_perm,)
        if self._cpu is not None:
            return (*self._cpu.device_tensors(), *perm)
        assert self._cuda is not None
        return (self._cuda.words, self._cuda.scale, self._cuda.bias, *perm)

    @property
    def cpu_int4(self) -> CpuQ4 | CpuInt4 | None:
        """The packed CPU form (gpu/cpu_decode.py calls its kernel directly), None on CUDA and
        where the input is reordered first (in_perm: those callers would skip the gather)."""
        return self._cpu if self.in_perm is None else None

    def blocks(self, rows: torch.Tensor | None = None) -> Int4Blocks:
        """The weight's blocks (of `rows` only, when given), columns in in_perm's order."""
        if self._cpu is not None:
            return self._cpu.blocks(rows)
        assert self._cuda is not None
        packed, scale, bias = self._cuda.rows(rows)
        return Int4Blocks(packed, scale, bias, 32)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 [N, K] (or the rows given), columns in the input's own order."""
        permuted = self.blocks(rows).dequantize()
        if self.in_perm is None:
            return permuted
        out = torch.empty_like(permuted)
        out[:, self.in_perm] = permuted
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_perm is not None:
            x = x.index_select(-1, self.in_perm)
        if self._cpu is not None:
            return self._cpu(x)
        from troupe.kernels.quant_int4 import int4_cols_matmul

        assert self._cuda is not None
        return int4_cols_matmul(x, self._cuda)


@functools.cache
def fbgemm_reduce_range() -> bool:
    """Whether fbgemm must take 7-bit activations here: without VNNI its AVX2/AVX-512 kernels
    sum pairs of u8 x s8 products in int16 (255 * 127 * 2 overflows it; 127 * 127 * 2 fits)."""
    return "avx512_vnni" not in cpu_flags()


class Int8Linear:
    """An 8-bit weight [N, K] (CPU); see the module docstring."""

    def __init__(self, blocks: Int8Blocks, q4: Q4Lib | None = None) -> None:
        self.shape = blocks.shape
        # the native kernel's layout is then the one copy kept (gpu/cpu_q8.py)
        self._native = CpuQ8(blocks, q4) if q4 is not None and fits_native_int8(blocks) else None
        self._blocks = None if self._native is not None else blocks
        if self._native is None:
            self._packed = self._prepack(blocks)

    def device_tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor it holds (sleep mode: gpu/sleep_parts.py); not fbgemm's packed copy,
        an opaque object whose memory torch cannot free in place."""
        if self._native is not None:
            return self._native.device_tensors()
        assert self._blocks is not None
        return (self._blocks.codes, self._blocks.scale)

    @property
    def native(self) -> CpuQ8 | None:
        """The native kernel's form (gpu/cpu_q8.py), None on fbgemm's path."""
        return self._native

    @property
    def blocks(self) -> Int8Blocks:
        """The exact blocks."""
        if self._native is not None:
            return self._native.blocks()
        assert self._blocks is not None
        return self._blocks

    @staticmethod
    def _prepack(blocks: Int8Blocks) -> Any:
        n = blocks.shape[0]
        row_codes, row_scale = per_row_int8(blocks)
        with warnings.catch_warnings():  # quantized tensors are deprecated; fbgemm reads them
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch._make_per_channel_quantized_tensor(
                row_codes, row_scale.double(), torch.zeros(n, dtype=torch.int64), 0
            )
        # fbgemm's own packed copy (the codes above are freed)
        return torch.ops.quantized.linear_prepack(qweight, None)

    def dequantize(self) -> torch.Tensor:
        return self.blocks.dequantize()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._native is not None:
            return self._native(x)
        if x.shape[0] > CPU_PACKED_MAX_ROWS:
            return F.linear(x, self.blocks.dequantize().to(x.dtype))
        # fbgemm quantizes x per call to 8 bits (one scale and zero point per call); 7 where
        # its int16 pair sums would saturate (fbgemm_reduce_range)
        out: torch.Tensor = torch.ops.quantized.linear_dynamic(
            x.float(), self._packed, fbgemm_reduce_range()
        )
        return out.to(x.dtype)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Exact rows `ids` as fp32 [len(ids), K]."""
        if self._native is not None:
            return self._native.blocks(ids).dequantize()
        return self.blocks.rows(ids).dequantize()


class Fp8Linear:
    """An fp8 e4m3 weight with block or per-channel scales (CUDA: kernels/quant_fp8.py)."""

    def __init__(self, fp8: Fp8Weight, device: torch.device) -> None:
        from troupe.kernels.quant_fp8 import Fp8Cols

        self.cols = Fp8Cols.from_rows(fp8.weight.to(device), fp8.scale.to(device))
        self.shape = fp8.shape

    def device_tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor it holds (sleep mode: gpu/sleep_parts.py)."""
        return (self.cols.words, self.cols.scale)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from troupe.kernels.quant_fp8 import fp8_cols_matmul

        return fp8_cols_matmul(x, self.cols)

    def rows(self, ids: torch.Tensor) -> Fp8Weight:
        """Rows `ids` of the weight in the checkpoint's form (codes and their scales)."""
        block_rows = self.cols.block[0]
        return Fp8Weight(self.cols.rows(ids), self.cols.scale[ids // block_rows])


QuantLinear = Int4Linear | Int8Linear | Fp8Linear
Weight = torch.Tensor | QuantLinear
# A decoder layer's projection: a Weight, or one with LoRA adapters (gpu/lora_linear.py)
Projection = Union[torch.Tensor, QuantLinear, "LoraLinear"]


def make_quant_linear(
    blocks: QuantBlocks | Fp8Weight,
    device: torch.device,
    q4: Q4Lib | None = None,
    in_perm: torch.Tensor | None = None,
) -> QuantLinear | None:
    """The layer for `blocks` on `device`; None where it has no packed path (the loader then
    expands the tensor to the model dtype). `q4`: the native CPU 4-bit kernel, if loaded;
    `in_perm`: the input order of an Int4 weight's columns (GPTQ act-order), if not its own."""
    if in_perm is not None and not isinstance(blocks, Int4Blocks):
        raise ValueError("an input order (in_perm) is only taken with Int4Blocks")
    if isinstance(blocks, Fp8Weight):
        if device.type != "cuda":
            return None
        from troupe.kernels.quant_fp8 import Fp8Cols

        return Fp8Linear(blocks, device) if Fp8Cols.fits(blocks.weight, blocks.scale) else None
    if isinstance(blocks, Int4Blocks):
        return Int4Linear(blocks, device, q4, in_perm)
    if device.type == "cpu":
        return Int8Linear(blocks, q4)
    return None


# fp32 CPU matmuls of at most this many rows run as weight @ x^T (see linear)
CPU_FEW_ROWS = 64


def linear(x: torch.Tensor, weight: Projection, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear over a dense or quantized weight (or one with LoRA adapters). A few fp32 rows on
    the CPU take weight @ x^T instead: BLAS packs the second operand into its cache-sized
    panels, and x @ weight^T made that the whole weight, copied on every call (4 rows of
    SmolLM2's layers: 20.8 ms as x @ w^T, 9.3 ms as w @ x^T on a 2-core EPYC; one row alike)."""
    if isinstance(weight, torch.Tensor):
        if x.dim() == 2 and x.shape[0] <= CPU_FEW_ROWS and _is_cpu_fp32(x, weight):
            out = torch.mm(weight, x.t()).t().contiguous()
            return out if bias is None else out + bias
        return F.linear(x, weight, bias)
    out = weight(x)
    return out if bias is None else out + bias


def _is_cpu_fp32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu"


def embedding(ids: torch.Tensor, weight: Weight, dtype: torch.dtype) -> torch.Tensor:
    """Rows of a dense or quantized embedding table, in `dtype`."""
    if isinstance(weight, torch.Tensor):
        return F.embedding(ids, weight)
    if isinstance(weight, Int8Linear):
        return weight.embedding(ids).to(dtype)
    if isinstance(weight, Fp8Linear):
        return weight.rows(ids).dequantize().to(dtype)
    return weight.dequantize(ids).to(dtype)
