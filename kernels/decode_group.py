"""The online-softmax step of both pass-1 decode kernels (kernels/decode_attention.py for a
16-bit KV cache, kernels/decode_attention_fp8.py for fp8): one KV tile folded into the GROUP
query heads' running state.

    m_i, l_i [BLOCK_G]  the running max and sum of exp2 (scores are in base 2)
    acc [BLOCK_G, BLOCK_D]  the unnormalized output

Their q loads and output stores are alike too but stay copied: as shared helpers they changed
the bf16 kernel's sm_90 SASS (the q load: TWO_PASS without splits, FUSED with a limit; the
store: FUSED).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softmax_step(qk, n_mask, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """(m_i, l_i, acc) after the tile's scores qk [BLOCK_G, BLOCK_N] (base 2; keys off n_mask
    masked) and values v [BLOCK_N, BLOCK_D]."""
    qk = tl.where(n_mask[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
