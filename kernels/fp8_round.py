"""Rounding to e4m3 in fp32 arithmetic, for the kernels that write an fp8 KV cache.

The value is rounded to nearest even at its e4m3 step (2^(e-3) in binade e, 2^-9 below the
smallest normal 2^-6) with the fp32 magic-number trick, so the cast to fp8 that follows is
exact. The GPU's own cast rounds the same way; Triton's interpreter does not where rounding
carries into the next binade (124.5 becomes 64), so doing it here keeps every backend equal
to kernels.kv_quant.quantize (torch's cast).
"""

# Triton kernels take untyped arguments; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to_e4m3(y):
    """y (fp32, already within +-448) rounded to the nearest e4m3 value, still fp32."""
    mag = tl.abs(y)
    exponent = ((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step_exp = tl.maximum(exponent, -6) - 3
    # 1.5 * 2^(step_exp + 23): adding it leaves fp32 an ulp of exactly 2^step_exp
    magic = (((step_exp + 23 + 127) << 23) | (1 << 22)).to(tl.float32, bitcast=True)
    rounded = (mag + magic) - magic
    return tl.where(y < 0, -rounded, rounded)
