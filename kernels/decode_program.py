"""Which sequence a decode program attends for: the kernels' side of kernels/decode_order.py."""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def program_sequence(order_ptr, HAS_ORDER: tl.constexpr):
    """The sequence this program attends for (int64): order[position], or the position."""
    position = tl.program_id(1)
    if HAS_ORDER:
        return tl.load(order_ptr + position).to(tl.int64)
    return position.to(tl.int64)
