"""The decode GEMV configs of kernels/quant_gemv.py: which kernel, and its launch shape.

    BYTES   quant_gemv.py's own GEMVs: uint8 / fp8 tiles, products summed in fp32, split K
            (the fp32-exact path; fp8's engine default)
    HALF2   packed f16x2 PTX, one x packing for all W rows of a thread (kernels/quant_half2.py,
            quant_half2_fp8.py; int4's engine default)

quant_gemv.INT4_GEMV / FP8_GEMV pick the engine's. The variants that lost on the H200 (int32-word
tiles with magic-number conversions, every x row in one program, the half2 register prefetch,
num_stages, maxnreg) are gone; their figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Int4Gemv(enum.Enum):
    BYTES = "bytes"  # quant_gemv._int4_gemv_kernel: uint8 tiles, split K (the old default)
    HALF2 = "half2"  # packed f16x2 PTX, one x packing for all rows (quant_half2.py)


class Fp8Gemv(enum.Enum):
    BYTES = "bytes"  # quant_gemv._fp8_gemv_kernel: fp8 tiles, split K
    HALF2 = "half2"  # packed f16x2 PTX, one x packing for all rows (quant_half2_fp8.py)


@dataclass(frozen=True)
class Int4GemvConfig:
    """The int4 decode GEMV (HALF2's launch; BYTES takes only variant and pdl): W rows per
    program, groups of 32 per row per iteration, warps, and K splits (0: ~4 programs per SM,
    quant_half2.launch_shape); pdl (both variants): launch with programmatic dependent launch,
    the first weight tile loaded before waiting for the previous kernel."""

    variant: Int4Gemv = Int4Gemv.BYTES
    block_n: int = 4
    groups: int = 16
    num_warps: int = 4
    k_splits: int = 1
    pdl: bool = False  # programmatic dependent launch (kernels/gemv_pdl.py; CUDA sm_90+ only)


@dataclass(frozen=True)
class Fp8GemvConfig:
    """The fp8 decode GEMV (HALF2's launch; BYTES: only variant and pdl): W rows per program,
    int32 words (4 codes each) per row per iteration, warps, K splits as Int4GemvConfig's."""

    variant: Fp8Gemv = Fp8Gemv.BYTES
    block_n: int = 4
    block_w: int = 128
    num_warps: int = 4
    k_splits: int = 1
    pdl: bool = False  # as Int4GemvConfig's
